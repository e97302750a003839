// The Redis backend (issue 5) over loopback: acquire + release of one GPU through the public
// library, with its Redis round trips counted; `status --pool` of a pool of 100 hosts x 8 GPUs;
// and a model of the seed's GPU.py (BRPOP/LPUSH), timed the same way. A plain program: it
// starts its own redis-server on a free loopback port (no persistence, a scratch directory),
// checks that the server answering is the one it started, and stops it. See docs/benchmarks.md.
//
// Round trips are counted on both sides: in this process, by wrapping hiredis's
// redisCommandArgv (every command gpulock sends goes through it), and on the server, from
// `INFO commandstats` deltas. The server's counts include the commands that scripts run
// inside the server, which are not round trips; both are printed.
#include <dlfcn.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gpulock/gpulock.hpp>

#include "backend/holder_record.h"
#include "bench_support.h"
#include "process_probe.h"
#include "redis/device_record.h"
#include "redis/packed_registrations.h"
#include "redis/redis_connection.h"
#include "redis/redis_scripts.h"
#include "redis/redis_url.h"

// ---- Round trips, counted in this process ---------------------------------------------------

namespace {
std::atomic<long long> g_commands_sent{0};
}  // namespace

// Every command the library sends (RedisConnection::command) and every command of the seed
// model below goes through hiredis's redisCommandArgv: this definition, in the executable,
// takes precedence over libhiredis.so's, counts the call and forwards it.
extern "C" void* redisCommandArgv(redisContext* c, int argc, const char** argv,
                                  const size_t* argvlen) {
  using Real = void* (*)(redisContext*, int, const char**, const size_t*);
  static const Real real = reinterpret_cast<Real>(::dlsym(RTLD_NEXT, "redisCommandArgv"));
  if (real == nullptr) {
    std::fprintf(stderr, "redis_bench: cannot find hiredis's redisCommandArgv\n");
    std::abort();
  }
  g_commands_sent.fetch_add(1, std::memory_order_relaxed);
  return real(c, argc, argv, argvlen);
}

namespace {

using gpulock_bench::now_ns;
using gpulock_bench::quantile;

// ---- Options --------------------------------------------------------------------------------

struct Options {
  std::string redis_server = "/usr/bin/redis-server";
  std::string gpulock_cli;
  std::string python = "/usr/bin/python3";
  std::set<std::string> only;  // empty: everything
  int iterations = 2000;       // acquire + release, seed model, raw calls
  int status_iterations = 200;
  int fresh_processes = 30;
  int spawn_iterations = 50;
  int hosts = 100;
  int gpus_per_host = 8;
  int handoff_hold_ms = 20;  // how long each hand-off benchmark lease is held
  int server_cpu = -1;       // --pin: CPUs for redis-server and for this program (and its children)
  int client_cpu = -1;
  bool wants(const std::string& part) const { return only.empty() || only.contains(part); }
};

// ---- Samples and tables ---------------------------------------------------------------------

struct Stats {
  double p50 = 0, p90 = 0, p99 = 0, max = 0;
  std::size_t n = 0;
};

Stats stats_of(std::vector<double> us) {
  Stats s;
  s.n = us.size();
  if (us.empty()) return s;
  s.p50 = quantile(us, 0.50);
  s.p90 = quantile(us, 0.90);
  s.p99 = quantile(us, 0.99);
  s.max = us.back();
  return s;
}

std::string fmt_us(double us) {
  char buffer[32];
  if (us >= 1000)
    std::snprintf(buffer, sizeof buffer, "%.2f ms", us / 1000);
  else
    std::snprintf(buffer, sizeof buffer, "%.0f us", us);
  return buffer;
}

void print_row(const std::string& what, const Stats& s, const std::string& extra = "") {
  std::printf("| %-58s | %9s | %9s | %9s | %9s | %s\n", what.c_str(), fmt_us(s.p50).c_str(),
              fmt_us(s.p90).c_str(), fmt_us(s.p99).c_str(), fmt_us(s.max).c_str(), extra.c_str());
}

void print_header(const char* title) {
  std::printf("\n## %s\n\n| %-58s | %9s | %9s | %9s | %9s | notes\n", title, "what", "p50", "p90",
              "p99", "max");
}

// Times `body` n times (microseconds per call).
std::vector<double> time_calls(int n, const std::function<void()>& body) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    const auto t0 = now_ns();
    body();
    us.push_back(static_cast<double>(now_ns() - t0) / 1e3);
  }
  return us;
}

// ---- A raw hiredis connection (for INFO, and for the seed model) ----------------------------

struct ReplyFree {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

class Raw {
 public:
  Raw(int port) {
    timeval tv{5, 0};
    context_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (context_ == nullptr || context_->err)
      throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port) + ": " +
                               (context_ ? context_->errstr : "out of memory"));
    redisSetTimeout(context_, tv);
  }
  ~Raw() {
    if (context_) redisFree(context_);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  Reply command(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lengths;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lengths.push_back(a.size());
    }
    Reply reply(static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data())));
    if (!reply || context_->err)
      throw std::runtime_error(std::string("redis command failed: ") + context_->errstr);
    if (reply->type == REDIS_REPLY_ERROR)
      throw std::runtime_error(args[0] + ": " + std::string(reply->str, reply->len));
    return reply;
  }
  std::string text(const std::vector<std::string>& args) {
    Reply r = command(args);
    return r->str ? std::string(r->str, r->len) : std::string();
  }

 private:
  redisContext* context_ = nullptr;
};

// `INFO commandstats` and `INFO stats`, parsed: command -> {calls, usec}; and a few counters.
struct ServerCounters {
  std::map<std::string, std::pair<long long, long long>> commands;
  long long net_output_bytes = 0;
  long long net_input_bytes = 0;
};

ServerCounters read_counters(Raw& raw) {
  ServerCounters out;
  std::istringstream in(raw.text({"INFO", "commandstats"}) + raw.text({"INFO", "stats"}));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.starts_with("cmdstat_")) {
      const auto colon = line.find(':');
      const std::string name = line.substr(8, colon - 8);
      long long calls = 0, usec = 0;
      std::sscanf(line.c_str() + colon + 1, "calls=%lld,usec=%lld", &calls, &usec);
      out.commands[name] = {calls, usec};
    } else if (line.starts_with("total_net_output_bytes:")) {
      out.net_output_bytes = std::atoll(line.c_str() + 23);
    } else if (line.starts_with("total_net_input_bytes:")) {
      out.net_input_bytes = std::atoll(line.c_str() + 22);
    }
  }
  return out;
}

long long used_memory(Raw& raw) {
  const std::string text = raw.text({"INFO", "memory"});
  const auto at = text.find("used_memory:");
  return at == std::string::npos ? 0 : std::atoll(text.c_str() + at + 12);
}

// What the server did between two readings, per iteration, without the INFO calls themselves.
struct ServerDelta {
  double all_commands = 0;  // every command executed, including those run inside scripts
  double evalsha = 0;
  double evalsha_usec = 0;  // server time in scripts
  double out_bytes = 0, in_bytes = 0;
  std::map<std::string, double> per_command;
};

ServerDelta delta(const ServerCounters& a, const ServerCounters& b, double n) {
  ServerDelta d;
  for (const auto& [name, after] : b.commands) {
    if (name == "info") continue;
    const auto it = a.commands.find(name);
    const long long calls = after.first - (it == a.commands.end() ? 0 : it->second.first);
    const long long usec = after.second - (it == a.commands.end() ? 0 : it->second.second);
    if (calls == 0) continue;
    d.all_commands += static_cast<double>(calls) / n;
    d.per_command[name] = static_cast<double>(calls) / n;
    if (name == "evalsha") {
      d.evalsha = static_cast<double>(calls) / n;
      d.evalsha_usec = static_cast<double>(usec) / n;
    }
  }
  // The INFO replies themselves are in these byte counts; they are small against n iterations.
  d.out_bytes = static_cast<double>(b.net_output_bytes - a.net_output_bytes) / n;
  d.in_bytes = static_cast<double>(b.net_input_bytes - a.net_input_bytes) / n;
  return d;
}

std::string describe(const ServerDelta& d, double client_round_trips) {
  std::string per;
  for (const auto& [name, calls] : d.per_command) {
    char item[96];
    std::snprintf(item, sizeof item, "%s%s %.2f", per.empty() ? "" : ", ", name.c_str(), calls);
    per += item;
  }
  char buffer[768];
  std::snprintf(buffer, sizeof buffer,
                "round trips %.2f (counted in hiredis); server: EVALSHA %.2f, all commands incl. "
                "inside scripts %.2f [%s], script time %.0f us, sent %.0f B, received %.0f B",
                client_round_trips, d.evalsha, d.all_commands, per.c_str(), d.evalsha_usec,
                d.out_bytes, d.in_bytes);
  return buffer;
}

// ---- The redis-server this benchmark starts ------------------------------------------------

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    throw std::runtime_error("cannot find a free loopback port");
  ::close(fd);
  return ntohs(addr.sin_port);
}

void pin_to_cpu(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0)
    throw std::runtime_error("cannot pin to CPU " + std::to_string(cpu));
}

class RedisServer {
 public:
  RedisServer(const std::string& binary, int cpu) : cpu_(cpu) {
    if (::access(binary.c_str(), X_OK) != 0)
      throw std::runtime_error(binary +
                               " not found (apt-get install redis-server; "
                               "--redis-server=PATH names another)");
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = free_loopback_port();
      if (start(binary)) return;
    }
    throw std::runtime_error("could not start redis-server (see its log in " +
                             dir_.path().string() + ")");
  }
  ~RedisServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);  // nothing to save: --save "" --appendonly no
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  pid_t pid() const { return pid_; }

 private:
  bool start(const std::string& binary) {
    const std::string port = std::to_string(port_);
    const std::string dir = dir_.path().string();
    const std::string log = dir + "/redis-" + port + ".log";
    std::vector<std::string> args{binary, "--port",       port, "--bind", "127.0.0.1", "--save",
                                  "",     "--appendonly", "no", "--dir",  dir,         "--logfile",
                                  log,    "--daemonize",  "no"};
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the benchmark
      if (::getppid() != parent) ::_exit(1);
      if (cpu_ >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu_, &set);
        if (::sched_setaffinity(0, sizeof set, &set) != 0) ::_exit(1);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(binary.c_str(), argv.data());
      ::_exit(127);
    }
    // Ready when it answers, and it is ours: another program may have taken the port between
    // free_loopback_port() and the server's bind (then ours exits at once).
    const auto deadline = now_ns() + 10'000'000'000LL;
    while (now_ns() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) return false;  // could not start (port?)
      try {
        Raw raw(port_);
        const std::string info = raw.text({"INFO", "server"});
        const auto at = info.find("process_id:");
        if (at != std::string::npos && std::atoi(info.c_str() + at + 11) == pid) {
          pid_ = pid;
          return true;
        }
        if (at != std::string::npos) {  // someone else's server: never touch it
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &status, 0);
          return false;
        }
      } catch (const std::exception&) {
        // not listening yet
      }
      gpulock_bench::sleep_ns(5'000'000);
    }
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return false;
  }

  gpulock_bench::TempDir dir_;
  int cpu_ = -1;
  pid_t pid_ = -1;
  int port_ = 0;
};

// ---- Pools ---------------------------------------------------------------------------------

gpulock::PoolOptions redis_options(const std::string& url, const std::string& pool,
                                   const std::string& host,
                                   std::optional<std::chrono::milliseconds> ttl = std::nullopt) {
  gpulock::PoolOptions options;
  options.backend = url;
  options.pool_name = pool;
  options.host_name = host;
  options.config = gpulock::Config{};  // no /etc/gpulock/config.toml
  options.lease_ttl = ttl;
  return options;
}

gpulock::LeaseRequest one_gpu_now() {
  gpulock::LeaseRequest request;
  request.count = 1;
  request.wait = false;  // everything is free: waiting would only hide a bug
  return request;
}

// Simulated UUIDs depend on GPULOCK_HOST (at each device read), not on PoolOptions::host_name:
// fake hosts in one process must set it while their pool reads its devices.
void set_fake_host(const std::string& host) {
  ::setenv("GPULOCK_HOST", host.c_str(), 1);
}

std::string lease_id_for(std::uint64_t i) {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx",
                static_cast<unsigned long long>(0xbe00000000000000ULL + i));
  return buffer;
}

// ---- 1. acquire + release of 1 GPU ---------------------------------------------------------

void bench_acquire_release(const Options& options, const RedisServer& server) {
  const std::string pool_name = "bench-acquire";
  const std::string host = "bench-host";
  set_fake_host(host);
  Raw info(server.port());
  gpulock::GpuPool pool(gpulock::make_simulated_source(8),
                        redis_options(server.url(), pool_name, host));
  const gpulock::LeaseRequest request = one_gpu_now();

  // The first acquire + release of this process (connects, loads the scripts, registers).
  long long c0 = g_commands_sent.load();
  auto t0 = now_ns();
  pool.acquire(request).release();
  const double first_us = static_cast<double>(now_ns() - t0) / 1e3;
  const long long first_rt = g_commands_sent.load() - c0;

  // Warm-up, then the steady state.
  for (int i = 0; i < 200; ++i) pool.acquire(request).release();
  const int n = options.iterations;
  const long long keys_before = info.command({"DBSIZE"})->integer;
  const long long memory_before = used_memory(info);
  const ServerCounters before = read_counters(info);
  c0 = g_commands_sent.load();
  std::uint64_t token_sum = 0;
  const std::vector<double> us = time_calls(n, [&] {
    gpulock::Lease lease = pool.acquire(request);
    token_sum += lease.fencing_token();
    lease.release();
  });
  const double rt = static_cast<double>(g_commands_sent.load() - c0) / n;
  const ServerCounters after = read_counters(info);
  const ServerDelta server_side = delta(before, after, n);
  if (token_sum == 0) throw std::runtime_error("no fencing tokens?");
  const double keys_left = static_cast<double>(info.command({"DBSIZE"})->integer - keys_before) / n;
  const double memory_left = static_cast<double>(used_memory(info) - memory_before) / n;

  print_header(
      "1. acquire + release of 1 GPU of 8, GpuPool over loopback Redis (aim: p50 <= 1 ms)");
  print_row("steady state (same GpuPool, " + std::to_string(n) + " iterations)", stats_of(us),
            describe(server_side, rt));
  std::printf("(each acquire + release left %.2f keys and %.0f bytes of server memory behind)\n",
              keys_left, memory_left);
  std::printf("| %-58s | %9s | %9s | %9s | %9s | round trips %lld\n",
              "first acquire + release of this process (new server)", fmt_us(first_us).c_str(), "",
              "", "", first_rt);

  // A shared lease of 10 GiB of one GPU (issue 15), in the same pool and run, against the
  // exclusive figure just measured and again after it (aim: shared <= 2x exclusive).
  {
    gpulock::LeaseRequest shared = request;
    shared.memory_bytes = std::uint64_t{10} << 30;
    for (int i = 0; i < 200; ++i) pool.acquire(shared).release();
    const long long c = g_commands_sent.load();
    const std::vector<double> shared_us = time_calls(n, [&] { pool.acquire(shared).release(); });
    const double shared_rt = static_cast<double>(g_commands_sent.load() - c) / n;
    const std::vector<double> again_us = time_calls(n, [&] { pool.acquire(request).release(); });
    const double baseline = std::min(stats_of(us).p50, stats_of(again_us).p50);
    char note[160];
    std::snprintf(note, sizeof note,
                  "round trips %.2f; p50 %.2fx the exclusive one (min of before and after: %s)",
                  shared_rt, stats_of(shared_us).p50 / baseline, fmt_us(baseline).c_str());
    print_row("shared 10 GiB of 1 GPU (same GpuPool, " + std::to_string(n) + " iterations)",
              stats_of(shared_us), note);
    print_row("exclusive again, after the shared ones", stats_of(again_us));
  }

  // The same with a new GpuPool each time, in this warm process (the scripts' SHA-1s are known
  // to the process; the pool connects and registers its host again).
  {
    std::vector<double> construct, first;
    long long rts = 0;
    const int m = std::max(20, n / 40);
    for (int i = 0; i < m; ++i) {
      auto a = now_ns();
      gpulock::GpuPool fresh(gpulock::make_simulated_source(8),
                             redis_options(server.url(), pool_name, host));
      auto b = now_ns();
      const long long c = g_commands_sent.load();
      fresh.acquire(request).release();
      auto e = now_ns();
      rts += g_commands_sent.load() - c;
      construct.push_back(static_cast<double>(b - a) / 1e3);
      first.push_back(static_cast<double>(e - b) / 1e3);
    }
    char note[128];
    std::snprintf(note, sizeof note, "round trips %.2f (+ a TCP connect); constructor p50 %s",
                  static_cast<double>(rts) / m, fmt_us(stats_of(construct).p50).c_str());
    print_row("first acquire + release of a new GpuPool (warm process)", stats_of(first), note);
  }

  // Where the time goes: the same Redis calls without the library around them.
  gpulock::RedisEndpoint endpoint = gpulock::parse_redis_url(server.url());
  auto connection = gpulock::RedisConnection::connect(endpoint, std::chrono::milliseconds(5000));
  const std::string version_key = "gpulock:{" + pool_name + "}:version";
  const std::string uuid = pool.devices().front().uuid;
  print_header("1b. the parts of one acquire + release (same server, same pool)");
  print_row("PING (RedisConnection::command)",
            stats_of(time_calls(n, [&] { connection->command({"PING"}); })));
  print_row("snapshot script, this host's 8 GPUs (RedisConnection::run)",
            stats_of(time_calls(n, [&] {
              connection->run(gpulock::redis_scripts::kSnapshot, {version_key}, {host});
            })));
  std::vector<double> acquire_us, release_us;
  for (int i = 0; i < n; ++i) {
    const std::string id = lease_id_for(static_cast<std::uint64_t>(i));
    auto a = now_ns();
    const gpulock::RedisValue r =
        connection->run(gpulock::redis_scripts::kAcquire, {version_key},
                        {id, "30000", "", "1", "all", "{}", "bench", host, "", "0", "", uuid});
    auto b = now_ns();
    if (r.elements.empty() || r.elements[0].text != "ok")
      throw std::runtime_error("raw acquire script: not ok");
    connection->run(gpulock::redis_scripts::kRelease, {version_key}, {id, uuid});
    auto e = now_ns();
    acquire_us.push_back(static_cast<double>(b - a) / 1e3);
    release_us.push_back(static_cast<double>(e - b) / 1e3);
  }
  print_row("acquire script, 1 GPU (RedisConnection::run)", stats_of(acquire_us));
  print_row("release script, 1 GPU (RedisConnection::run)", stats_of(release_us));
  auto source = gpulock::make_simulated_source(8);
  print_row("8 simulated devices read + their registration JSON (per acquire)",
            stats_of(time_calls(n, [&] {
              std::string signature;
              for (const auto& d : source->devices())
                signature += gpulock::device_static_json(d) + gpulock::device_readings_json(d);
              benchmark::DoNotOptimize(signature.data());
            })));
  print_row("std::thread start + join (a lease's renewal thread)",
            stats_of(time_calls(n, [] { std::thread([] {}).join(); })));
}

// A fresh process: its first acquire + release, then its second. Printed as one line.
int first_call_worker(const std::string& url, const std::string& pool_name) {
  set_fake_host("bench-host");
  const auto a = now_ns();
  gpulock::GpuPool pool(gpulock::make_simulated_source(8),
                        redis_options(url, pool_name, "bench-host"));
  const auto b = now_ns();
  long long c = g_commands_sent.load();
  pool.acquire(one_gpu_now()).release();
  const auto e = now_ns();
  const long long first_rt = g_commands_sent.load() - c;
  c = g_commands_sent.load();
  pool.acquire(one_gpu_now()).release();
  const auto f = now_ns();
  const long long second_rt = g_commands_sent.load() - c;
  std::printf("%.1f %.1f %lld %.1f %lld\n", static_cast<double>(b - a) / 1e3,
              static_cast<double>(e - b) / 1e3, first_rt, static_cast<double>(f - e) / 1e3,
              second_rt);
  return 0;
}

// Runs a command; returns its standard output (the command must succeed).
std::string capture(const std::vector<std::string>& args) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  if (rc != 0) throw std::runtime_error("cannot start " + args[0]);
  std::string out;
  char buffer[4096];
  ssize_t got;
  while ((got = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0)
    out.append(buffer, static_cast<std::size_t>(got));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error(args[0] + " failed");
  return out;
}

void bench_fresh_processes(const Options& options, const RedisServer& server,
                           const std::string& self) {
  std::vector<double> construct, first, second;
  double first_rt = 0, second_rt = 0;
  for (int i = 0; i < options.fresh_processes; ++i) {
    const std::string line = capture({self, "--first-call-worker", server.url(), "bench-acquire"});
    double c = 0, f = 0, s = 0;
    long long frt = 0, srt = 0;
    if (std::sscanf(line.c_str(), "%lf %lf %lld %lf %lld", &c, &f, &frt, &s, &srt) != 5)
      throw std::runtime_error("worker: unexpected output: " + line);
    construct.push_back(c);
    first.push_back(f);
    second.push_back(s);
    first_rt += static_cast<double>(frt) / options.fresh_processes;
    second_rt += static_cast<double>(srt) / options.fresh_processes;
  }
  char note[128];
  print_header("1c. a fresh process (this program re-executed), GpuPool constructed, then:");
  std::snprintf(note, sizeof note, "round trips %.2f (+ a TCP connect); constructor p50 %s",
                first_rt, fmt_us(stats_of(construct).p50).c_str());
  print_row(
      "its first acquire + release (" + std::to_string(options.fresh_processes) + " processes)",
      stats_of(first), note);
  std::snprintf(note, sizeof note, "round trips %.2f", second_rt);
  print_row("its second acquire + release", stats_of(second), note);
}

// ---- 2. status of 100 hosts x 8 GPUs ------------------------------------------------------

void bench_status_cli(const Options& options, const RedisServer& server);

void bench_status(const Options& options, const RedisServer& server) {
  const std::string pool_name = "bench-status";
  const auto ttl = std::chrono::milliseconds(600'000);  // no renewal while measuring
  std::vector<std::unique_ptr<gpulock::GpuPool>> pools;
  std::vector<gpulock::Lease> leases;
  std::size_t leased_gpus = 0;
  char name[32];
  for (int h = 0; h < options.hosts; ++h) {
    std::snprintf(name, sizeof name, "host-%03d", h);
    set_fake_host(name);
    pools.push_back(std::make_unique<gpulock::GpuPool>(
        gpulock::make_simulated_source(static_cast<unsigned>(options.gpus_per_host)),
        redis_options(server.url(), pool_name, name, ttl)));
    pools.back()->status();  // registers the host's GPUs
    // Host h holds h % 4 of its GPUs in one lease: 75 leases, 150 GPUs of 800.
    const unsigned held = static_cast<unsigned>(h % 4);
    if (held > 0 && static_cast<int>(held) <= options.gpus_per_host) {
      gpulock::LeaseRequest request = one_gpu_now();
      request.count = held;
      request.label = "bench";
      leases.push_back(pools.back()->acquire(request));
      leased_gpus += held;
    }
  }
  // Every call below is made as host-000 (GpuPool::pool_status also re-registers its host
  // when the registration is 30 s old, and must then read host-000's simulated UUIDs).
  set_fake_host("host-000");
  gpulock::GpuPool& pool = *pools.front();
  const gpulock::PoolStatus check = pool.pool_status();
  std::size_t leased_seen = 0;
  for (const auto& g : check.gpus)
    if (g.state == gpulock::GpuState::kLeased) ++leased_seen;
  if (check.gpus.size() != static_cast<std::size_t>(options.hosts * options.gpus_per_host) ||
      leased_seen != leased_gpus)
    throw std::runtime_error("pool status shows " + std::to_string(check.gpus.size()) + " GPUs, " +
                             std::to_string(leased_seen) + " leased; expected " +
                             std::to_string(options.hosts * options.gpus_per_host) + ", " +
                             std::to_string(leased_gpus));

  const int n = options.status_iterations;
  Raw info(server.port());
  char title[160];
  std::snprintf(title, sizeof title,
                "2. status of a pool of %d hosts x %d GPUs, %zu leases holding %zu GPUs "
                "(aim: p50 <= 10 ms)",
                options.hosts, options.gpus_per_host, leases.size(), leased_gpus);
  print_header(title);
  gpulock::RedisEndpoint endpoint = gpulock::parse_redis_url(server.url());
  auto connection = gpulock::RedisConnection::connect(endpoint, std::chrono::milliseconds(5000));
  const std::string version_key = "gpulock:{" + pool_name + "}:version";
  Raw raw(server.port());
  const std::string sha = raw.text({"SCRIPT", "LOAD", gpulock::redis_scripts::kSnapshot.source});
  for (int i = 0; i < 10; ++i) pool.pool_status();

  // Three ways of reading the whole pool, taking turns so that load changes favour none:
  // the library's pool_status(); the snapshot script through the library's RedisConnection
  // (the reply copied into RedisValues); the bare EVALSHA (hiredis's parse, nothing copied).
  std::vector<double> status_us, run_us, bare_us;
  long long status_rt = 0;
  const ServerCounters before = read_counters(info);
  const long long c0 = g_commands_sent.load();
  for (int i = 0; i < n; ++i) {
    const auto t0 = now_ns();
    const long long c = g_commands_sent.load();
    {
      const gpulock::PoolStatus s = pool.pool_status();
      benchmark::DoNotOptimize(s.gpus.data());
    }
    status_rt += g_commands_sent.load() - c;
    const auto t1 = now_ns();
    {
      const gpulock::RedisValue v =
          connection->run(gpulock::redis_scripts::kSnapshot, {version_key}, {""});
      benchmark::DoNotOptimize(v.elements.data());
    }
    const auto t2 = now_ns();
    {
      Reply r = raw.command({"EVALSHA", sha, "1", version_key, ""});
      benchmark::DoNotOptimize(r->elements);
    }
    const auto t3 = now_ns();
    status_us.push_back(static_cast<double>(t1 - t0) / 1e3);
    run_us.push_back(static_cast<double>(t2 - t1) / 1e3);
    bare_us.push_back(static_cast<double>(t3 - t2) / 1e3);
  }
  // Three snapshot calls per iteration, each the same script over the same keys.
  const double calls = 3.0 * n;
  const double rt = static_cast<double>(g_commands_sent.load() - c0) / calls;
  const ServerDelta d = delta(before, read_counters(info), calls);
  char own[96];
  std::snprintf(own, sizeof own, " (per snapshot call; pool_status's own round trips: %.2f)",
                static_cast<double>(status_rt) / n);
  print_row("GpuPool::pool_status()", stats_of(status_us), describe(d, rt) + own);
  print_row("snapshot script, whole pool (RedisConnection::run: reply copied)", stats_of(run_us));
  print_row("snapshot script, whole pool (bare hiredis EVALSHA)", stats_of(bare_us));
  print_row("GpuPool::status() (this host's 8 GPUs, same pool)",
            stats_of(time_calls(n, [&] { benchmark::DoNotOptimize(pool.status().gpus.data()); })));

  // A cold pool: a new GpuPool in this (warm) process, and its first pool_status(): it
  // connects, registers its host, and parses every registration (a warm pool keeps them
  // parsed, keyed by their JSON). What `gpulock status --pool` does, without starting a
  // process and without printing.
  {
    std::vector<double> cold_us, second_us;
    long long cold_rt = 0;
    const int m = std::max(20, n / 10);
    for (int i = 0; i < m; ++i) {
      const long long c = g_commands_sent.load();
      const auto a = now_ns();
      gpulock::GpuPool fresh(
          gpulock::make_simulated_source(static_cast<unsigned>(options.gpus_per_host)),
          redis_options(server.url(), pool_name, "host-000", ttl));
      {
        const gpulock::PoolStatus s = fresh.pool_status();
        benchmark::DoNotOptimize(s.gpus.data());
      }
      const auto b = now_ns();
      cold_rt += g_commands_sent.load() - c;
      {
        const gpulock::PoolStatus s = fresh.pool_status();
        benchmark::DoNotOptimize(s.gpus.data());
      }
      const auto e = now_ns();
      cold_us.push_back(static_cast<double>(b - a) / 1e3);
      second_us.push_back(static_cast<double>(e - b) / 1e3);
    }
    char note[160];
    std::snprintf(note, sizeof note,
                  "round trips %.2f (+ a TCP connect): register + snapshot; %d new pools",
                  static_cast<double>(cold_rt) / m, m);
    print_row("GpuPool::pool_status(), a new GpuPool's first (cold)", stats_of(cold_us), note);
    print_row("... and that GpuPool's second (warm)", stats_of(second_us));
  }

  // What a cold pool parses: every GPU's two JSON documents, from each host's package (a warm
  // pool parses a registration again only when its JSON changed).
  const gpulock::RedisValue reply =
      connection->run(gpulock::redis_scripts::kSnapshot, {version_key}, {""});
  const auto& hosts = reply.elements.at(2).elements;
  std::vector<gpulock::PackedRegistration> registrations;
  for (std::size_t i = 0; i + 3 < hosts.size(); i += 4)
    if (const auto packed = gpulock::unpack_registrations(hosts[i + 3].text))
      for (const auto& [uuid, registration] : *packed) registrations.push_back(registration);
  std::size_t parsed = 0;
  print_row("unpack_registrations() of every host of the reply (" +
                std::to_string(hosts.size() / 4) + ")",
            stats_of(time_calls(n, [&] {
              parsed = 0;
              for (std::size_t i = 0; i + 3 < hosts.size(); i += 4)
                if (const auto packed = gpulock::unpack_registrations(hosts[i + 3].text))
                  parsed += packed->size();
            })));
  print_row("parse_registered_device() for every GPU of the reply (" +
                std::to_string(registrations.size()) + ", cold pool only)",
            stats_of(time_calls(n, [&] {
              parsed = 0;
              for (const auto& r : registrations)
                if (gpulock::parse_registered_device(r.static_json, r.readings_json)) ++parsed;
            })));
  if (registrations.empty() || parsed != registrations.size())
    throw std::runtime_error("unparsable registrations?");

  // The leases' holder records, parsed on every status.
  const auto& lease_fields = reply.elements.at(4).elements;
  print_row("parse_holder_record() for every lease of the reply (" +
                std::to_string(lease_fields.size() / 4) + ")",
            stats_of(time_calls(n, [&] {
              for (std::size_t i = 0; i + 3 < lease_fields.size(); i += 4)
                benchmark::DoNotOptimize(gpulock::parse_holder_record(lease_fields[i + 1].text));
            })));
  {  // What the reply carries (the server's byte count is in the pool_status() row above).
    std::size_t gpu_json = 0, record_bytes = 0, record_trimmed = 0;
    for (const auto& r : registrations) gpu_json += r.static_json.size() + r.readings_json.size();
    for (std::size_t i = 0; i + 3 < lease_fields.size(); i += 4) {
      const std::string& text = lease_fields[i + 1].text;
      record_bytes += text.size();
      const auto last = text.find_last_not_of(" \n");
      record_trimmed += last == std::string::npos ? 0 : last + 1;
    }
    std::printf(
        "(the reply carries %zu bytes of GPU JSON (static + readings) and %zu bytes of "
        "holder records in %zu leases, %zu of them without trailing whitespace: %zu bytes of "
        "padding)\n",
        gpu_json, record_bytes, lease_fields.size() / 4, record_trimmed,
        record_bytes - record_trimmed);
  }
  {  // `gpulock status --pool --json` renders with this.
    const gpulock::PoolStatus s = pool.pool_status();
    const std::size_t size = gpulock::status_to_json(s).size();
    print_row(
        "status_to_json() of that status (" + std::to_string(s.gpus.size()) + " GPUs)",
        stats_of(time_calls(std::max(20, n / 4),
                            [&] { benchmark::DoNotOptimize(gpulock::status_to_json(s).data()); })),
        std::to_string(size) + " bytes of JSON");
  }
  bench_status_cli(options, server);  // while the leases are held
}

// `gpulock status --pool` as a command: spawn to exit, output to /dev/null.
std::vector<double> time_spawns(const std::vector<std::string>& args, int n,
                                const std::vector<std::string>& env_extra) {
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& x : env_extra)
      if (entry.substr(0, entry.find('=') + 1) == x.substr(0, x.find('=') + 1)) replaced = true;
    if (!replaced) env_store.push_back(entry);
  }
  env_store.insert(env_store.end(), env_extra.begin(), env_extra.end());
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    const auto t0 = now_ns();
    pid_t pid = 0;
    if (::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data()) != 0)
      throw std::runtime_error("cannot start " + args[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    us.push_back(static_cast<double>(now_ns() - t0) / 1e3);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw std::runtime_error(args[0] + " " + (args.size() > 1 ? args[1] : "") + " failed");
  }
  posix_spawn_file_actions_destroy(&actions);
  return us;
}

// ---- 3. a model of the seed GPU.py ---------------------------------------------------------

// GPU.py (seed 003) as its README documents it; its code is not available here. `--get` pops
// an idle GPU id with BRPOP and records the caller's parent PID as its owner; `--release ID`
// removes the owner and pushes the id back. Key names are this model's own.
struct SeedModel {
  std::string idle = "gpu_py_model:idle";
  std::string owner = "gpu_py_model:owner";

  void init(Raw& r, int gpus) {
    r.command({"DEL", idle, owner});
    for (int i = 0; i < gpus; ++i) r.command({"LPUSH", idle, std::to_string(i)});
  }
  std::string get(Raw& r) {
    Reply popped = r.command({"BRPOP", idle, "0"});  // [list, id]
    const std::string id(popped->element[1]->str, popped->element[1]->len);
    r.command({"HSET", owner, id, std::to_string(::getppid())});
    return id;
  }
  void release(Raw& r, const std::string& id) {
    r.command({"HDEL", owner, id});
    r.command({"LPUSH", idle, id});
  }
};

void bench_seed(const Options& options, const RedisServer& server) {
  const int n = options.iterations;
  Raw info(server.port());
  Raw r(server.port());
  SeedModel seed;
  seed.init(r, 8);
  for (int i = 0; i < 200; ++i) seed.release(r, seed.get(r));

  print_header("3. MODEL of the seed's GPU.py --get / --release (its documented algorithm)");
  ServerCounters before = read_counters(info);
  long long c0 = g_commands_sent.load();
  const auto kept = time_calls(n, [&] { seed.release(r, seed.get(r)); });
  double rt = static_cast<double>(g_commands_sent.load() - c0) / n;
  print_row("get + release, one connection kept", stats_of(kept),
            describe(delta(before, read_counters(info), n), rt));

  before = read_counters(info);
  c0 = g_commands_sent.load();
  const auto fresh = time_calls(n, [&] {
    std::string id;
    {
      Raw get_connection(server.port());  // each GPU.py call is a new process: a new connection
      id = seed.get(get_connection);
    }
    Raw release_connection(server.port());
    seed.release(release_connection, id);
  });
  rt = static_cast<double>(g_commands_sent.load() - c0) / n;
  print_row("get + release, a new connection for each (as per process)", stats_of(fresh),
            describe(delta(before, read_counters(info), n), rt));
}

// Whole processes: what a shell script pays per lease with each tool.
void bench_processes(const Options& options, const RedisServer& server) {
  gpulock_bench::TempDir scratch;
  const std::string config = (scratch.path() / "config.toml").string();
  std::ofstream(config).close();
  const std::vector<std::string> env{
      "GPULOCK_BACKEND=" + server.url(), "GPULOCK_POOL=bench-cli",
      "GPULOCK_HOST=bench-cli-host",     "GPULOCK_FAKE_GPUS=8",
      "GPULOCK_CONFIG=" + config,        "GPULOCK_DIR=" + (scratch.path() / "locks").string()};
  const int n = options.spawn_iterations;
  std::vector<double> bare, python, run_redis, status_pool;
  const bool have_cli =
      !options.gpulock_cli.empty() && ::access(options.gpulock_cli.c_str(), X_OK) == 0;
  const bool have_python = ::access(options.python.c_str(), X_OK) == 0;
  if (have_cli) time_spawns({options.gpulock_cli, "run", "-n", "1", "--", "/bin/true"}, 3, env);
  // Interleaved, so that load changes favour no command.
  for (int i = 0; i < n; ++i) {
    auto add = [](std::vector<double>& to, const std::vector<double>& one) {
      to.insert(to.end(), one.begin(), one.end());
    };
    add(bare, time_spawns({"/bin/true"}, 1, env));
    if (have_python) add(python, time_spawns({options.python, "-c", "pass"}, 1, env));
    if (have_cli)
      add(run_redis,
          time_spawns({options.gpulock_cli, "run", "-n", "1", "--", "/bin/true"}, 1, env));
  }
  print_header("3b. whole processes (spawn to exit)");
  print_row("/bin/true", stats_of(bare));
  if (have_python)
    print_row("python3 -c pass (GPU.py starts one per --get and per --release)", stats_of(python));
  if (have_cli) print_row("gpulock run -n 1 -- /bin/true, Redis backend", stats_of(run_redis));
  if (!have_cli) std::printf("(gpulock CLI not found: --gpulock=PATH)\n");
}

void bench_status_cli(const Options& options, const RedisServer& server) {
  if (options.gpulock_cli.empty() || ::access(options.gpulock_cli.c_str(), X_OK) != 0) return;
  gpulock_bench::TempDir scratch;
  const std::string config = (scratch.path() / "config.toml").string();
  std::ofstream(config).close();
  const std::vector<std::string> env{
      "GPULOCK_BACKEND=" + server.url(), "GPULOCK_POOL=bench-status", "GPULOCK_HOST=host-000",
      "GPULOCK_FAKE_GPUS=" + std::to_string(options.gpus_per_host), "GPULOCK_CONFIG=" + config};
  const int n = options.spawn_iterations;
  std::vector<double> text, json;
  for (int i = 0; i < n; ++i) {
    auto one = time_spawns({options.gpulock_cli, "status", "--pool"}, 1, env);
    text.push_back(one[0]);
    one = time_spawns({options.gpulock_cli, "status", "--pool", "--json"}, 1, env);
    json.push_back(one[0]);
  }
  print_row("`gpulock status --pool` (whole process, output to /dev/null)", stats_of(text));
  print_row("`gpulock status --pool --json` (whole process)", stats_of(json));
}

// ---- 5. cost against pool size (issue 13) ---------------------------------------------------

// A pool of `hosts` hosts x `gpus_per_host` GPUs, each host holding h % 4 of its GPUs (as in
// part 2); the pools of every host stay open (their leases are renewed by nobody: a long TTL).
struct ScaledPool {
  std::vector<std::unique_ptr<gpulock::GpuPool>> hosts;
  std::vector<gpulock::Lease> leases;
};

ScaledPool make_scaled_pool(const RedisServer& server, const std::string& pool_name, int hosts,
                            int gpus_per_host) {
  ScaledPool out;
  char name[32];
  for (int h = 0; h < hosts; ++h) {
    std::snprintf(name, sizeof name, "host-%03d", h);
    set_fake_host(name);
    out.hosts.push_back(std::make_unique<gpulock::GpuPool>(
        gpulock::make_simulated_source(static_cast<unsigned>(gpus_per_host)),
        redis_options(server.url(), pool_name, name, std::chrono::milliseconds(600'000))));
    out.hosts.back()->status();  // registers the host's GPUs
    const unsigned held = static_cast<unsigned>(h % 4);
    if (h > 0 && held > 0 && static_cast<int>(held) < gpus_per_host) {
      gpulock::LeaseRequest request = one_gpu_now();
      request.count = held;
      out.leases.push_back(out.hosts.back()->acquire(request));
    }
  }
  set_fake_host("host-000");
  return out;
}

void bench_scale(const Options& options, const RedisServer& server) {
  const std::vector<int> sizes{1, 100, 300};
  std::vector<ScaledPool> pools;
  for (int hosts : sizes)
    pools.push_back(make_scaled_pool(server, "bench-scale-" + std::to_string(hosts), hosts,
                                     options.gpus_per_host));
  const gpulock::LeaseRequest request = one_gpu_now();
  for (auto& pool : pools)
    for (int i = 0; i < 100; ++i) pool.hosts.front()->acquire(request).release();
  // Rounds of 50 calls at each size in turn, so that load changes favour no size.
  std::vector<std::vector<double>> us(sizes.size());
  std::vector<long long> round_trips(sizes.size(), 0);
  const int rounds = std::max(1, options.iterations / 50);
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      gpulock::GpuPool& pool = *pools[k].hosts.front();
      const long long c = g_commands_sent.load();
      const auto one = time_calls(50, [&] { pool.acquire(request).release(); });
      round_trips[k] += g_commands_sent.load() - c;
      us[k].insert(us[k].end(), one.begin(), one.end());
    }
  print_header(
      "5a. acquire + release of 1 GPU of this host, by pool size (aim: p50 <= 1 ms at each)");
  const double base = stats_of(us[0]).p50;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    char note[96];
    std::snprintf(note, sizeof note, "p50 %.2fx the 1-host pool's; round trips %.2f",
                  stats_of(us[k]).p50 / base,
                  static_cast<double>(round_trips[k]) / static_cast<double>(us[k].size()));
    print_row(std::to_string(sizes[k]) + " hosts x " + std::to_string(options.gpus_per_host) +
                  " GPUs (" + std::to_string(pools[k].leases.size()) + " leases elsewhere)",
              stats_of(us[k]), note);
  }

  if (options.gpulock_cli.empty() || ::access(options.gpulock_cli.c_str(), X_OK) != 0) return;
  gpulock_bench::TempDir scratch;
  const std::string config = (scratch.path() / "config.toml").string();
  std::ofstream(config).close();
  print_header("5b. `gpulock status --pool`, one-shot process (aim: p50 <= 10 ms at 100 hosts)");
  std::vector<std::vector<double>> spawn(sizes.size());
  for (int i = 0; i < options.spawn_iterations; ++i)
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const std::vector<std::string> env{
          "GPULOCK_BACKEND=" + server.url(), "GPULOCK_POOL=bench-scale-" + std::to_string(sizes[k]),
          "GPULOCK_HOST=host-000", "GPULOCK_FAKE_GPUS=" + std::to_string(options.gpus_per_host),
          "GPULOCK_CONFIG=" + config};
      const auto one = time_spawns({options.gpulock_cli, "status", "--pool"}, 1, env);
      spawn[k].push_back(one[0]);
    }
  const double spawn_base = stats_of(spawn[0]).p50;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    char note[64];
    std::snprintf(note, sizeof note, "p50 %.2fx the 1-host pool's",
                  stats_of(spawn[k]).p50 / spawn_base);
    print_row("status --pool, " + std::to_string(sizes[k]) + " hosts x " +
                  std::to_string(options.gpus_per_host) + " GPUs",
              stats_of(spawn[k]), note);
  }
}

// ---- 6. hand-off under load (issue 13) ----------------------------------------------------

// A worker (this program re-executed): `leases` times, waits for 1 GPU of 4 of host "handoff",
// reports "A gpu t_ns" right after acquire() returns, holds it `hold_us`, reports "R gpu t_ns"
// right before release(). Each line is one write(2) below PIPE_BUF: lines never interleave.
int handoff_worker(const std::string& url, const std::string& pool_name, int leases, int hold_us) {
  set_fake_host("handoff");
  gpulock::GpuPool pool(gpulock::make_simulated_source(4),
                        redis_options(url, pool_name, "handoff", std::chrono::milliseconds(10000)));
  gpulock::LeaseRequest request;
  request.count = 1;
  request.wait = true;
  char line[96];
  for (int i = 0; i < leases; ++i) {
    gpulock::Lease lease = pool.acquire(request);
    const int gpu = static_cast<int>(lease.gpus().at(0).index);
    int n = std::snprintf(line, sizeof line, "A %d %lld %d\n", gpu,
                          static_cast<long long>(now_ns()), static_cast<int>(::getpid()));
    if (::write(1, line, static_cast<std::size_t>(n)) != n) return 1;
    std::this_thread::sleep_for(std::chrono::microseconds(hold_us));
    n = std::snprintf(line, sizeof line, "R %d %lld %d\n", gpu, static_cast<long long>(now_ns()),
                      static_cast<int>(::getpid()));
    if (::write(1, line, static_cast<std::size_t>(n)) != n) return 1;
    lease.release();
  }
  return 0;
}

// The hand-offs' times (us): all of them, and those of the steady state, from when the last
// worker to start had its first lease to when the first to finish had its last (before, the
// workers are still starting and registering; after, fewer of them wait).
struct Handoffs {
  std::vector<double> all_us;
  std::vector<double> steady_us;
};

// `workers` processes taking `leases` leases each of 1 GPU of 4.
Handoffs run_handoffs(const Options& options, const RedisServer& server, int workers, int leases) {
  const int hold_us = options.handoff_hold_ms * 1000;
  const std::string pool_name = "bench-handoff-" + std::to_string(workers);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  std::vector<pid_t> pids;
  for (int w = 0; w < workers; ++w) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    std::vector<std::string> args{self,      "--handoff-worker",     server.url(),
                                  pool_name, std::to_string(leases), std::to_string(hold_us)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start a worker");
    posix_spawn_file_actions_destroy(&actions);
    pids.push_back(pid);
  }
  ::close(pipe_fds[1]);
  std::string out;
  char buffer[65536];
  ssize_t got;
  while ((got = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0)
    out.append(buffer, static_cast<std::size_t>(got));
  ::close(pipe_fds[0]);
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      throw std::runtime_error("a hand-off worker failed");
  }
  // Per GPU, the events in time order: each A must follow an R (or be the first), and the
  // hand-off is the time from that R to the A.
  struct Event {
    long long t;
    char kind;
    int pid;
  };
  std::map<int, std::vector<Event>> per_gpu;
  std::istringstream lines(out);
  char kind;
  int gpu, pid;
  long long t;
  std::size_t acquired = 0;
  while (lines >> kind >> gpu >> t >> pid) {
    per_gpu[gpu].push_back(Event{t, kind, pid});
    if (kind == 'A') ++acquired;
  }
  if (acquired != static_cast<std::size_t>(workers * leases))
    throw std::runtime_error("hand-off: " + std::to_string(acquired) + " leases reported, not " +
                             std::to_string(workers * leases));
  // Each worker's first and last lease.
  std::map<int, std::pair<long long, long long>> span;
  for (const auto& [g, events] : per_gpu)
    for (const Event& e : events) {
      auto [it, added] = span.try_emplace(e.pid, e.t, e.t);
      it->second.first = std::min(it->second.first, e.t);
      it->second.second = std::max(it->second.second, e.t);
    }
  long long steady_from = 0, steady_to = std::numeric_limits<long long>::max();
  for (const auto& [p, first_last] : span) {
    steady_from = std::max(steady_from, first_last.first);
    steady_to = std::min(steady_to, first_last.second);
  }
  Handoffs handoffs;
  for (auto& [g, events] : per_gpu) {
    std::sort(events.begin(), events.end(),
              [](const Event& a, const Event& b) { return a.t < b.t; });
    for (std::size_t i = 0; i < events.size(); ++i) {
      const char want = i % 2 == 0 ? 'A' : 'R';
      if (events[i].kind != want || (want == 'R' && events[i].pid != events[i - 1].pid))
        throw std::runtime_error("hand-off: GPU " + std::to_string(g) + " held twice");
      if (want == 'A' && i > 0) {
        const double us = static_cast<double>(events[i].t - events[i - 1].t) / 1e3;
        handoffs.all_us.push_back(us);
        if (events[i - 1].t >= steady_from && events[i].t <= steady_to)
          handoffs.steady_us.push_back(us);
      }
    }
  }
  return handoffs;
}

void bench_handoff(const Options& options, const RedisServer& server) {
  char title[200];
  std::snprintf(title, sizeof title,
                "6. hand-off release -> next holder on 4 GPUs of one host, each lease held %d ms "
                "(aim with 64 processes: p50 <= 2 ms, p99 <= 20 ms)",
                options.handoff_hold_ms);
  print_header(title);
  // The baseline: as many processes as GPUs, so that a release usually has a waiter (the
  // releaser itself comes back) but no queue to plan.
  const std::vector<double> base = run_handoffs(options, server, 5, 40).all_us;
  const Handoffs loaded = run_handoffs(options, server, 64, 10);
  print_row("5 processes: release() started -> acquire() returned", stats_of(base),
            std::to_string(base.size()) + " hand-offs; no GPU held twice");
  char note[128];
  std::snprintf(note, sizeof note, "%zu hand-offs; no GPU held twice; p50 %.2fx the 5's",
                loaded.all_us.size(), stats_of(loaded.all_us).p50 / stats_of(base).p50);
  print_row("64 processes: release() started -> acquire() returned", stats_of(loaded.all_us), note);
  if (loaded.steady_us.empty()) return;
  std::snprintf(note, sizeof note, "%zu hand-offs while all 64 ran (no start-up, no wind-down)",
                loaded.steady_us.size());
  print_row("64 processes, steady state", stats_of(loaded.steady_us), note);
}

void usage() {
  std::fprintf(stderr,
               "usage: redis_bench [--only acquire,fresh,status,seed,processes,scale,handoff]\n"
               "                   [--iterations N]\n"
               "                   [--status-iterations N] [--fresh-processes N]\n"
               "                   [--spawn-iterations N] [--hosts N] [--gpus-per-host N]\n"
               "                   [--handoff-hold-ms N]\n"
               "                   [--redis-server PATH] [--gpulock PATH] [--python PATH]\n"
               "                   [--pin same|split]\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--first-call-worker")
    return first_call_worker(argv[2], argv[3]);
  if (argc == 6 && std::string(argv[1]) == "--handoff-worker")
    return handoff_worker(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]));
  Options options;
#ifdef GPULOCK_BENCH_CLI
  options.gpulock_cli = GPULOCK_BENCH_CLI;
#endif
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc && key != "--help") {
      value = argv[++i];
    }
    if (key == "--only") {
      std::stringstream list(value);
      for (std::string part; std::getline(list, part, ',');) options.only.insert(part);
    } else if (key == "--iterations") {
      options.iterations = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--status-iterations") {
      options.status_iterations = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--fresh-processes") {
      options.fresh_processes = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--spawn-iterations") {
      options.spawn_iterations = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--hosts") {
      options.hosts = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--handoff-hold-ms") {
      options.handoff_hold_ms = std::max(0, std::atoi(value.c_str()));
    } else if (key == "--gpus-per-host") {
      options.gpus_per_host = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--redis-server") {
      options.redis_server = value;
    } else if (key == "--gpulock") {
      options.gpulock_cli = value;
    } else if (key == "--python") {
      options.python = value;
    } else if (key == "--pin") {
      // same: the server and this program on CPU 0; split: the server on CPU 1, this on 0.
      if (value != "same" && value != "split") {
        usage();
        return 2;
      }
      options.client_cpu = 0;
      options.server_cpu = value == "same" ? 0 : 1;
    } else {
      usage();
      return 2;
    }
  }
  try {
    pin_to_cpu(options.client_cpu);
    RedisServer server(options.redis_server, options.server_cpu);
    std::printf("redis-server pid %d on 127.0.0.1:%d (--save \"\" --appendonly no)%s\n",
                static_cast<int>(server.pid()), server.port(),
                options.server_cpu < 0 ? ""
                : options.server_cpu == options.client_cpu
                    ? "; it and this program on CPU 0"
                    : "; it on CPU 1, this program on CPU 0");
    {  // Check that the round-trip counter sees the library's commands.
      auto c = gpulock::RedisConnection::connect(gpulock::parse_redis_url(server.url()),
                                                 std::chrono::milliseconds(5000));
      const long long before = g_commands_sent.load();
      c->command({"PING"});
      if (g_commands_sent.load() != before + 1)
        throw std::runtime_error("the round-trip counter does not see the library's commands");
    }
    std::printf("times per call; round trips per call; p99/max over the iterations shown\n");
    std::fflush(stdout);
    if (options.wants("acquire")) bench_acquire_release(options, server);
    std::fflush(stdout);
    if (options.wants("fresh"))
      bench_fresh_processes(options, server, std::filesystem::read_symlink("/proc/self/exe"));
    std::fflush(stdout);
    if (options.wants("status")) bench_status(options, server);
    std::fflush(stdout);
    if (options.wants("seed")) bench_seed(options, server);
    std::fflush(stdout);
    if (options.wants("processes")) bench_processes(options, server);
    std::fflush(stdout);
    if (options.wants("scale")) bench_scale(options, server);
    std::fflush(stdout);
    if (options.wants("handoff")) bench_handoff(options, server);
    std::fflush(stdout);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "redis_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
