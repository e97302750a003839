// The fair queue (issue 3) with real processes: hand-off latency with 64 waiters, idle waiters'
// CPU and wake-ups, leases per second; and churn at 64, 256 and 1,024 processes against the same
// churn on bare flock(2) locks (issue 12). Workers are this program re-executed (`--worker`), each
// using GpuPool::open() on simulated GPUs in a scratch GPULOCK_DIR. See docs/benchmarks.md.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gpulock/gpulock.hpp>

#include "bench_support.h"
#include "process_probe.h"

namespace {

using gpulock_bench::now_ns;
using gpulock_bench::ProcSample;

constexpr std::int64_t kMs = 1'000'000;
constexpr std::int64_t kSecond = 1'000'000'000;
// Longer than the dispatcher's quick re-checks after a release (1 + 4 + 20 ms).
constexpr std::int64_t kQuietNs = 40 * kMs;
constexpr std::int64_t kSettleTimeoutNs = 120 * kSecond;

// ---- Messages and records ------------------------------------------------------------------

enum : std::int32_t { kAcquired = 1, kReleased = 2 };

// Written to the shared report pipe (descriptor 3); 24 bytes, so each write is atomic.
struct Message {
  std::int32_t worker = 0;
  std::int32_t kind = 0;
  std::int32_t gpu = -1;
  std::int32_t waited = 0;
  std::int64_t t_ns = 0;
};

// One lease of one GPU, written by the worker to its record file when it exits.
struct Record {
  std::int32_t worker = 0;
  std::int32_t gpu = 0;
  std::int32_t waited = 0;  // acquire() had to wait (its on_progress hook fired)
  std::int32_t pid = 0;
  std::int64_t t_acq = 0;    // right after acquire() returned
  std::int64_t t_rel = 0;    // right before release()
  std::int64_t t_freed = 0;  // right after release() returned
};

// ---- Worker processes ----------------------------------------------------------------------

constexpr int kReportFd = 3;
constexpr int kCommandFd = 4;

void send(const Message& m) {
  if (!gpulock_bench::write_all(kReportFd, &m, sizeof m)) ::_exit(3);
}

char command() {
  char c = 0;
  return gpulock_bench::read_all(kCommandFd, &c, 1) ? c : 'q';
}

void write_records(const std::string& path, const std::vector<Record>& records) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(records.data()),
            static_cast<std::streamsize>(records.size() * sizeof(Record)));
}

// Kinds:
//   hold:  leases `count` GPUs, reports kAcquired, releases on any command byte.
//   step:  acquire 1 GPU, report kAcquired, wait for 'r', release, report kReleased; then
//          'a' = queue again, 'q' = exit.
//   once:  acquire 1 GPU, release it at once (or after 0..max_hold_us, uniformly), exit.
//   churn: acquire 1 GPU and release at once, again and again, until a lease starts after the
//          end time (read from `end_file` after the first lease).
//   flock-hold, flock-churn: the kernel's floor for the same churn, without gpulock: files
//          flock-0 .. flock-3 in GPULOCK_DIR stand for the 4 GPUs; the holder flock(2)s all of
//          them, and worker i loops blocking flock(LOCK_EX) / flock(LOCK_UN) on file i % 4.
//   ring-churn: the kernel's floor for a fair hand-off: P workers in a ring of FIFOs ring-1 ..
//          ring-P in GPULOCK_DIR (made by the parent; `count` is P), 4 tokens (one per GPU) that
//          the parent puts in. Worker i loops: a blocking read of its FIFO (a token: a lease of
//          that GPU; 'q': stop), then writes the token to worker i + 1's FIFO. Each lease costs
//          what any fair queue must pay at least: one wake-up of the next process, in order.
// Lease times are kept in memory and written to `records_path` at exit (not sent one by one, so
// that the parent need not run during the measurement).
// The flock(2) file standing for simulated GPU `gpu` (flock-hold, flock-churn); it stays open
// until the worker exits.
int open_flock_file(int gpu) {
  const char* dir = std::getenv("GPULOCK_DIR");
  if (dir) ::mkdir(dir, 0755);  // gpulock would make it; nobody has
  const std::string path = std::string(dir ? dir : ".") + "/flock-" + std::to_string(gpu);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  return fd;
}

// Reads the end of the measurement window once it is there (after the first lease).
std::int64_t read_end(const std::string& end_file) {
  std::int64_t end = -1;
  std::ifstream in(end_file);
  in >> end;
  return in ? end : -1;
}

// A baseline's lease of `gpu` by worker `index`, taken and given back now (it does nothing).
Record floor_lease(int index, int gpu) {
  Record r;
  r.t_acq = now_ns();
  r.worker = index;
  r.pid = ::getpid();
  r.waited = 1;
  r.gpu = gpu;
  r.t_rel = now_ns();
  return r;
}

int flock_worker_main(const std::string& kind, int index, unsigned count,
                      const std::string& records_path, const std::string& end_file) {
  std::vector<Record> records;
  if (kind == "flock-hold") {
    for (unsigned g = 0; g < count; ++g)
      if (::flock(open_flock_file(static_cast<int>(g)), LOCK_EX) != 0) return 5;
    send(Message{index, kAcquired, -1, 0, now_ns()});
    command();
    return 0;  // the locks go with the descriptors
  }
  const int gpu = index % 4;
  const int fd = open_flock_file(gpu);
  std::int64_t end = -1;
  while (true) {
    if (::flock(fd, LOCK_EX) != 0) return 5;
    const Record r = floor_lease(index, gpu);
    if (::flock(fd, LOCK_UN) != 0) return 5;
    records.push_back(r);
    if (end < 0 && (end = read_end(end_file)) < 0) return 4;
    if (r.t_acq >= end) break;
  }
  write_records(records_path, records);
  return 0;
}

// The name of ring worker `index`'s FIFO (1 .. P), in the lock directory (GPULOCK_DIR).
std::string ring_fifo_name(int index) {
  return "ring-" + std::to_string(index);
}

// The FIFO of ring worker `index`, as the worker finds it.
std::string ring_fifo(int index) {
  const char* dir = std::getenv("GPULOCK_DIR");
  return std::string(dir ? dir : ".") + "/" + ring_fifo_name(index);
}

int ring_worker_main(int index, unsigned processes, const std::string& records_path,
                     const std::string& end_file) {
  // Both ends read-write: opening never blocks, and a writer never meets a FIFO without readers.
  const int mine = ::open(ring_fifo(index).c_str(), O_RDWR | O_CLOEXEC);
  const int next =
      ::open(ring_fifo(index % static_cast<int>(processes) + 1).c_str(), O_RDWR | O_CLOEXEC);
  if (mine < 0 || next < 0) return 5;
  std::vector<Record> records;
  std::int64_t end = -1;
  while (true) {
    char token = 0;
    if (!gpulock_bench::read_all(mine, &token, 1)) return 5;
    if (token == 'q') break;
    const Record r = floor_lease(index, token);
    if (!gpulock_bench::write_all(next, &token, 1)) return 5;
    records.push_back(r);
    if (end < 0 && (end = read_end(end_file)) < 0) return 4;
    if (r.t_acq >= end) break;
  }
  write_records(records_path, records);
  return 0;
}

int worker_main(const std::string& kind, int index, unsigned count, const std::string& records_path,
                const std::string& end_file, std::int64_t max_hold_us) {
  if (kind == "ring-churn") return ring_worker_main(index, count, records_path, end_file);
  if (kind.starts_with("flock-"))
    return flock_worker_main(kind, index, count, records_path, end_file);
  gpulock::GpuPool pool = gpulock::GpuPool::open();
  gpulock::LeaseRequest request;
  request.count = count;
  bool waited = false;
  gpulock::WaitHooks hooks;
  hooks.on_progress = [&waited](const gpulock::WaitProgress&) { waited = true; };
  std::vector<Record> records;
  std::minstd_rand random(static_cast<unsigned>(::getpid()));
  const auto lease_once = [&] {
    waited = false;
    gpulock::Lease lease = pool.acquire(request, hooks);
    Record r;
    r.t_acq = now_ns();
    r.worker = index;
    r.pid = ::getpid();
    r.waited = waited ? 1 : 0;
    r.gpu = static_cast<std::int32_t>(lease.gpus().front().index);
    if (max_hold_us > 0)
      gpulock_bench::sleep_ns(std::uniform_int_distribution<std::int64_t>(0, max_hold_us)(random) *
                              1000);
    r.t_rel = now_ns();
    lease.release();
    r.t_freed = now_ns();
    records.push_back(r);
    return r;
  };

  if (kind == "hold") {
    gpulock::Lease lease = pool.acquire(request, hooks);
    const std::int64_t t_acq = now_ns();
    const std::vector<gpulock::LeasedGpu> gpus = lease.gpus();
    send(Message{index, kAcquired, -1, 0, t_acq});
    command();
    const std::int64_t t_rel = now_ns();
    lease.release();
    for (const auto& gpu : gpus)
      records.push_back(
          Record{index, static_cast<std::int32_t>(gpu.index), 0, ::getpid(), t_acq, t_rel});
  } else if (kind == "step") {
    while (true) {
      waited = false;
      gpulock::Lease lease = pool.acquire(request, hooks);
      const std::int64_t t_acq = now_ns();
      const auto gpu = static_cast<std::int32_t>(lease.gpus().front().index);
      send(Message{index, kAcquired, gpu, waited ? 1 : 0, t_acq});
      if (command() != 'r') break;
      const std::int64_t t_rel = now_ns();
      lease.release();
      send(Message{index, kReleased, gpu, 0, t_rel});
      if (command() != 'a') break;
    }
  } else if (kind == "once") {
    lease_once();
  } else if (kind == "churn") {
    std::int64_t end = -1;
    while (true) {
      const Record r = lease_once();
      if (end < 0) {
        std::ifstream in(end_file);
        in >> end;
        if (!in) return 4;
      }
      if (r.t_acq >= end) break;
    }
  } else {
    return 2;
  }
  if (!records_path.empty()) write_records(records_path, records);
  return 0;
}

// ---- Statistics ------------------------------------------------------------------------------

struct Latency {
  std::size_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // milliseconds
  std::size_t over_1ms = 0, over_10ms = 0, over_1s = 0;
};

Latency latency_of(std::vector<double> ms) {
  Latency l;
  l.n = ms.size();
  if (ms.empty()) return l;
  for (double v : ms) {
    l.over_1ms += v > 1;
    l.over_10ms += v > 10;
    l.over_1s += v > 1000;
  }
  l.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size());
  l.p50 = gpulock_bench::quantile(ms, 0.50);
  l.p90 = gpulock_bench::quantile(ms, 0.90);
  l.p99 = gpulock_bench::quantile(ms, 0.99);
  l.max = ms.back();
  return l;
}

// --verbose: hand-offs slower than this are listed on stderr, with the processes involved.
double g_show_slower_ms = -1;

// Hand-offs in the records: per GPU, each lease by a process that had to wait, paired with the
// lease of that GPU before it; the time from that lease's release to this acquisition, in ms.
// Only acquisitions at or after `from` and before `to` count.
std::vector<double> handoffs(std::vector<Record> records, std::int64_t from, std::int64_t to) {
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) {
    return a.gpu != b.gpu ? a.gpu < b.gpu : a.t_acq < b.t_acq;
  });
  std::vector<double> out;
  for (std::size_t i = 1; i < records.size(); ++i) {
    const Record& before = records[i - 1];
    const Record& r = records[i];
    if (r.gpu != before.gpu || !r.waited || r.t_acq < from || r.t_acq >= to) continue;
    out.push_back(static_cast<double>(r.t_acq - before.t_rel) / kMs);
    if (g_show_slower_ms >= 0 && out.back() > g_show_slower_ms)
      std::fprintf(
          stderr,
          "  slow hand-off: %.2f ms, GPU %d, pid %d -> pid %d, released at %.6f s, release() "
          "took %.2f ms\n",
          out.back(), r.gpu, before.pid, r.pid, static_cast<double>(before.t_rel) / kSecond,
          static_cast<double>(before.t_freed - before.t_rel) / kMs);
  }
  return out;
}

struct Summary {
  double mean = 0, p50 = 0, max = 0;
};
Summary summary_of(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.p50 = gpulock_bench::quantile(v, 0.5);
  s.max = v.back();
  return s;
}

void print_latency_header() {
  std::printf("  %-34s %9s %8s %8s %8s %8s %8s %6s %6s %5s\n", "variant", "hand-offs", "mean ms",
              "p50 ms", "p90 ms", "p99 ms", "max ms", ">1ms", ">10ms", ">1s");
}

void print_latency(const std::string& name, const Latency& l) {
  std::printf("  %-34s %9zu %8.3f %8.3f %8.3f %8.3f %8.2f %6zu %6zu %5zu\n", name.c_str(), l.n,
              l.mean, l.p50, l.p90, l.p99, l.max, l.over_1ms, l.over_10ms, l.over_1s);
}

// ---- The parent: a scratch machine and its worker processes ---------------------------------

class Machine {
 public:
  explicit Machine(unsigned gpus) {
    std::ofstream empty_config(config_path());  // no limits, fair share
    std::filesystem::create_directories(records_dir());
    env_ = {"GPULOCK_FAKE_GPUS=" + std::to_string(gpus), "GPULOCK_DIR=" + lock_dir().string(),
            "GPULOCK_CONFIG=" + config_path().string(), "LC_ALL=C"};
    if (const char* path = std::getenv("PATH")) env_.push_back(std::string("PATH=") + path);
    if (const char* home = std::getenv("HOME")) env_.push_back(std::string("HOME=") + home);
  }
  Machine(const Machine&) = delete;
  Machine& operator=(const Machine&) = delete;
  // After a failure, workers not reaped yet are killed, so that none is left waiting.
  ~Machine() {
    for (pid_t pid : pids_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  std::filesystem::path lock_dir() const { return scratch_.lock_dir(); }
  std::filesystem::path config_path() const { return scratch_.path() / "config.toml"; }
  std::filesystem::path records_dir() const { return scratch_.path() / "records"; }
  std::filesystem::path end_file() const { return scratch_.path() / "end_ns"; }

  pid_t spawn(const std::string& kind, int index, unsigned count, int report_fd, int command_fd,
              std::int64_t max_hold_us = 0) {
    const std::string records =
        kind == "step" ? "" : (records_dir() / ("w" + std::to_string(index))).string();
    const pid_t pid = gpulock_bench::spawn_process(
        "/proc/self/exe",
        {"queue_bench", "--worker", kind, std::to_string(index), std::to_string(count), records,
         end_file().string(), std::to_string(max_hold_us)},
        env_, report_fd, command_fd);
    pids_.push_back(pid);
    return pid;
  }

  // Live tickets in the queue directory.
  int tickets() const {
    DIR* dir = ::opendir((lock_dir() / "queue").c_str());
    if (dir == nullptr) return 0;
    int n = 0;
    while (const dirent* e = ::readdir(dir)) n += std::string_view(e->d_name).ends_with(".ticket");
    ::closedir(dir);
    return n;
  }

  // Waits until `n` tickets are queued and every process is asleep and quiet.
  std::vector<ProcSample> settle(const std::vector<pid_t>& pids, int n) {
    const std::int64_t give_up = now_ns() + kSettleTimeoutNs;
    while (now_ns() < give_up) {
      std::vector<ProcSample> s = gpulock_bench::wait_until_quiet(pids, kQuietNs, kSettleTimeoutNs);
      if (!s.empty() && tickets() == n) return s;
    }
    throw std::runtime_error("the workers did not settle (queue length " +
                             std::to_string(tickets()) + ", wanted " + std::to_string(n) + ")");
  }

  // Waits for every spawned process; returns their resource usage by pid.
  std::map<pid_t, rusage> reap() {
    std::map<pid_t, rusage> usage;
    while (!pids_.empty()) {
      const pid_t pid = pids_.front();
      int status = 0;
      rusage ru{};
      if (::wait4(pid, &status, 0, &ru) != pid) throw std::runtime_error("wait4 failed");
      pids_.erase(pids_.begin());
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw std::runtime_error("a worker failed (status " + std::to_string(status) + ")");
      usage[pid] = ru;
    }
    return usage;
  }

  std::vector<Record> records() const {
    std::vector<Record> out;
    for (const auto& entry : std::filesystem::directory_iterator(records_dir())) {
      std::ifstream in(entry.path(), std::ios::binary);
      Record r;
      while (in.read(reinterpret_cast<char*>(&r), sizeof r)) out.push_back(r);
    }
    return out;
  }

  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  gpulock_bench::TempDir scratch_;
  std::vector<std::string> env_;
  std::vector<pid_t> pids_;
};

long long voluntary_delta(const rusage& ru, const ProcSample& before) {
  return ru.ru_nvcsw - before.voluntary;
}

// ---- 1 + 3: step-by-step hand-offs, each with 64 sleeping waiters ----------------------------

struct StepResult {
  Latency latency;
  Summary others_per_handoff, distinct_per_handoff, new_holder, others_per_arrival,
      distinct_per_arrival;
  // How often the waiter at each queue position (1 = next) woke, over all hand-offs / arrivals.
  std::map<int, int> woke_at_handoff, woke_at_arrival;
  int out_of_order = 0;  // hand-offs that did not go to the oldest waiter
};

// Waits until `n` tickets are queued (spawning one waiter at a time keeps spawn order).
void wait_for_tickets(const Machine& machine, int n) {
  const std::int64_t give_up = now_ns() + 30 * kSecond;
  while (machine.tickets() < n && now_ns() < give_up) gpulock_bench::sleep_ns(200'000);
}

StepResult run_steps(int waiters, int steps) {
  Machine machine(1);
  gpulock_bench::Pipe report = gpulock_bench::Pipe::make();
  std::vector<gpulock_bench::Pipe> commands;
  for (int i = 0; i <= waiters; ++i) commands.push_back(gpulock_bench::Pipe::make());
  std::vector<pid_t> pids;
  pids.push_back(machine.spawn("step", 0, 1, report.write_end, commands[0].read_end));
  Message m;
  if (!gpulock_bench::read_all_within(report.read_end, &m, sizeof m, 30'000) || m.kind != kAcquired)
    throw std::runtime_error("the first holder did not acquire");
  std::deque<int> queue;  // worker indices in queue order (FIFO: one user)
  for (int i = 1; i <= waiters; ++i) {
    pids.push_back(machine.spawn("step", i, 1, report.write_end, commands[i].read_end));
    wait_for_tickets(machine, i);
    queue.push_back(i);
  }
  for (auto& c : commands) ::close(c.read_end);
  std::vector<ProcSample> a = machine.settle(pids, waiters);

  StepResult result;
  std::vector<double> latency, others_h, distinct_h, holder_h, others_a, distinct_a;
  // Wake-ups of the waiters other than `skip_a` and `skip_b` between two samples.
  const auto count = [&](const std::vector<ProcSample>& from, const std::vector<ProcSample>& to,
                         int skip_a, int skip_b, std::map<int, int>& by_position,
                         std::vector<double>& total, std::vector<double>& distinct) {
    double sum = 0, processes = 0;
    for (std::size_t position = 0; position < queue.size(); ++position) {
      const int i = queue[position];
      if (i == skip_a || i == skip_b) continue;
      const long long d = to[i].voluntary - from[i].voluntary;
      sum += static_cast<double>(d);
      if (d > 0) {
        ++processes;
        ++by_position[static_cast<int>(position) + 1];
      }
    }
    total.push_back(sum);
    distinct.push_back(processes);
  };
  int holder = 0;
  for (int step = 0; step < steps; ++step) {
    gpulock_bench::write_all(commands[holder].write_end, "r", 1);
    std::optional<Message> released, acquired;
    while (!released || !acquired) {
      // A lost wake-up waits for the dispatcher's safety re-check (10 s).
      if (!gpulock_bench::read_all_within(report.read_end, &m, sizeof m, 90'000))
        throw std::runtime_error("no hand-off within 90 s");
      if (m.kind == kReleased && m.worker == holder) released = m;
      if (m.kind == kAcquired) acquired = m;
    }
    latency.push_back(static_cast<double>(acquired->t_ns - released->t_ns) / kMs);
    const int next = acquired->worker;
    const std::vector<ProcSample> b = machine.settle(pids, waiters - 1);
    count(a, b, holder, next, result.woke_at_handoff, others_h, distinct_h);
    holder_h.push_back(static_cast<double>(b[next].voluntary - a[next].voluntary));
    if (queue.front() != next) ++result.out_of_order;
    queue.erase(std::find(queue.begin(), queue.end(), next));

    // The old holder queues again: one arrival.
    gpulock_bench::write_all(commands[holder].write_end, "a", 1);
    a = machine.settle(pids, waiters);
    queue.push_back(holder);
    count(b, a, holder, next, result.woke_at_arrival, others_a, distinct_a);
    holder = next;
  }

  // Let everyone through once, then quit.
  gpulock_bench::write_all(commands[holder].write_end, "rq", 2);
  for (int left = waiters; left > 0;) {
    if (!gpulock_bench::read_all_within(report.read_end, &m, sizeof m, 90'000))
      throw std::runtime_error("the queue did not drain");
    if (m.kind != kAcquired) continue;
    gpulock_bench::write_all(commands[m.worker].write_end, "rq", 2);
    --left;
  }
  machine.reap();
  for (auto& c : commands) ::close(c.write_end);
  report.close_both();

  result.latency = latency_of(latency);
  result.others_per_handoff = summary_of(others_h);
  result.distinct_per_handoff = summary_of(distinct_h);
  result.new_holder = summary_of(holder_h);
  result.others_per_arrival = summary_of(others_a);
  result.distinct_per_arrival = summary_of(distinct_a);
  return result;
}

// "position 2: 300, position 3: 300": who woke, and how often.
std::string positions(const std::map<int, int>& by_position) {
  std::string out;
  for (const auto& [position, n] : by_position)
    out += (out.empty() ? "" : ", ") + std::string("position ") + std::to_string(position) + ": " +
           std::to_string(n);
  return out.empty() ? "none" : out;
}

// ---- 1 + 2 + 3: a full queue behind a holder, optionally idle for a while, then drained ------

struct DrainResult {
  std::vector<double> latency;  // ms
  double voluntary_per_handoff = 0;
  // Over the idle window (if any):
  double idle_cpu_ticks_s = 0, idle_runtime_s = 0;
  long long idle_voluntary = 0, idle_involuntary = 0;
  int idle_woke = 0;
  std::vector<long long> idle_voluntary_by_position;
};

// Worker 0: holds every GPU from construction until release(), so that the others queue.
class AllGpusHolder {
 public:
  AllGpusHolder(Machine& machine, unsigned gpus, const std::string& kind = "hold") {
    pid_ = machine.spawn(kind, 0, gpus, report_.write_end, command_.read_end);
    Message m;
    if (!gpulock_bench::read_all_within(report_.read_end, &m, sizeof m, 30'000))
      throw std::runtime_error("the holder did not acquire");
  }
  ~AllGpusHolder() {
    report_.close_both();
    command_.close_both();
  }
  AllGpusHolder(const AllGpusHolder&) = delete;
  AllGpusHolder& operator=(const AllGpusHolder&) = delete;
  pid_t pid() const { return pid_; }
  void release() { gpulock_bench::write_all(command_.write_end, "r", 1); }

 private:
  gpulock_bench::Pipe report_ = gpulock_bench::Pipe::make();
  gpulock_bench::Pipe command_ = gpulock_bench::Pipe::make();
  pid_t pid_ = -1;
};

DrainResult run_drain(unsigned gpus, int waiters, double idle_seconds, std::int64_t max_hold_us) {
  Machine machine(gpus);
  AllGpusHolder holder(machine, gpus);
  std::vector<pid_t> waiting;
  for (int i = 1; i <= waiters; ++i) {
    waiting.push_back(machine.spawn("once", i, 1, -1, -1, max_hold_us));
    wait_for_tickets(machine, i);  // queue position i is worker i
  }
  std::vector<pid_t> all = waiting;
  all.push_back(holder.pid());
  std::vector<ProcSample> before = machine.settle(all, waiters);
  before.pop_back();

  DrainResult result;
  if (idle_seconds > 0) {
    gpulock_bench::sleep_ns(static_cast<std::int64_t>(idle_seconds * kSecond));
    const std::vector<ProcSample> after = gpulock_bench::sample_processes(waiting);
    const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      result.idle_cpu_ticks_s +=
          static_cast<double>(after[i].cpu_ticks - before[i].cpu_ticks) / tick;
      result.idle_runtime_s +=
          static_cast<double>(after[i].runtime_ns - before[i].runtime_ns) / 1e9;
      const long long v = after[i].voluntary - before[i].voluntary;
      result.idle_voluntary += v;
      result.idle_involuntary += after[i].involuntary - before[i].involuntary;
      result.idle_woke += v > 0;
      result.idle_voluntary_by_position.push_back(v);
    }
    before = after;
  }

  holder.release();
  const std::map<pid_t, rusage> usage = machine.reap();
  long long voluntary = 0;
  for (std::size_t i = 0; i < waiting.size(); ++i)
    voluntary += voluntary_delta(usage.at(waiting[i]), before[i]);
  const std::vector<Record> records = machine.records();
  result.latency = handoffs(records, 0, INT64_MAX);
  result.voluntary_per_handoff = static_cast<double>(voluntary) / waiters;
  return result;
}

// ---- 1 + 3 + 4: every process acquires and releases at once, over and over -------------------

struct ChurnResult {
  Latency latency;
  std::size_t leases = 0;  // acquisitions in the window
  double seconds = 0;
  std::size_t min_per_process = 0, max_per_process = 0;
  double median_per_process = 0, jain = 0;
  double voluntary_per_lease = 0, cpu_per_lease_us = 0;
  // The longest a GPU stayed free between a release and its next lease, in the window (ms).
  double max_idle_ms = 0;
};

// Per GPU, the longest time from a release to the next lease of that GPU, for leases in
// [from, to), in ms. Under churn someone always waits, so this is free-GPU idle time.
double max_idle_ms(std::vector<Record> records, std::int64_t from, std::int64_t to) {
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) {
    return a.gpu != b.gpu ? a.gpu < b.gpu : a.t_acq < b.t_acq;
  });
  std::int64_t longest = 0;
  for (std::size_t i = 1; i < records.size(); ++i)
    if (records[i].gpu == records[i - 1].gpu && records[i].t_acq >= from && records[i].t_acq < to)
      longest = std::max(longest, records[i].t_acq - records[i - 1].t_rel);
  return static_cast<double>(longest) / kMs;
}

// `processes` processes churn through `gpus` GPUs: through gpulock (kind "churn"), through
// bare flock(2) files (kind "flock-churn", 4 GPUs), the kernel's floor for the same churn, or
// through a ring of FIFOs (kind "ring-churn", 4 tokens), the kernel's floor for a fair hand-off.
ChurnResult run_churn(unsigned gpus, int processes, double seconds, double warm_up,
                      const std::string& kind = "churn") {
  const bool floor = kind != "churn";
  const bool ring = kind == "ring-churn";
  Machine machine(gpus);
  if (ring) {
    std::filesystem::create_directories(machine.lock_dir());
    for (int i = 1; i <= processes; ++i)
      if (::mkfifo((machine.lock_dir() / ring_fifo_name(i)).c_str(), 0600) != 0)
        throw std::runtime_error("mkfifo failed");
  }
  // The ring needs no holder: nothing moves until the parent puts the tokens in.
  std::optional<AllGpusHolder> holder;
  if (!ring) holder.emplace(machine, gpus, floor ? "flock-hold" : "hold");
  std::vector<pid_t> workers;
  for (int i = 1; i <= processes; ++i)
    workers.push_back(machine.spawn(kind, i, ring ? static_cast<unsigned>(processes) : 1u, -1, -1));
  std::vector<pid_t> all = workers;
  if (holder) all.push_back(holder->pid());
  std::vector<ProcSample> before = machine.settle(all, floor ? 0 : processes);

  const std::int64_t start = now_ns();
  const std::int64_t from = start + static_cast<std::int64_t>(warm_up * kSecond);
  const std::int64_t to = from + static_cast<std::int64_t>(seconds * kSecond);
  {
    const auto tmp = machine.end_file().string() + ".tmp";
    std::ofstream(tmp) << to << "\n";
    std::filesystem::rename(tmp, machine.end_file());
  }
  // Writes `byte` into ring worker `index`'s FIFO.
  const auto put = [&](int index, char byte) {
    const int fd = ::open((machine.lock_dir() / ring_fifo_name(index)).c_str(),
                          O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || !gpulock_bench::write_all(fd, &byte, 1))
      throw std::runtime_error("cannot write to a ring FIFO");
    ::close(fd);
  };
  if (ring) {
    // The 4 tokens, spread evenly around the ring; once the window is over, every worker that
    // still waits is told to stop (the tokens stop at the first worker that has left).
    for (unsigned g = 0; g < gpus; ++g)
      put(1 + static_cast<int>(g) * processes / static_cast<int>(gpus), static_cast<char>(g));
    gpulock_bench::sleep_ns(std::max<std::int64_t>(0, to - now_ns()) + 200 * kMs);
    for (int i = 1; i <= processes; ++i) put(i, 'q');
  } else {
    holder->release();
  }
  const std::map<pid_t, rusage> usage = machine.reap();
  const std::vector<Record> records = machine.records();

  ChurnResult r;
  r.seconds = seconds;
  r.latency = latency_of(handoffs(records, from, to));
  r.max_idle_ms = max_idle_ms(records, from, to);
  std::map<int, std::size_t> per_process;
  for (int i = 1; i <= processes; ++i) per_process[i] = 0;
  std::size_t all_leases = 0;
  for (const Record& rec : records) {
    if (rec.worker == 0) continue;
    ++all_leases;
    if (rec.t_acq >= from && rec.t_acq < to) {
      ++per_process[rec.worker];
      ++r.leases;
    }
  }
  std::vector<double> counts;
  for (const auto& [worker, n] : per_process) counts.push_back(static_cast<double>(n));
  double sum = 0, squares = 0;
  for (double c : counts) {
    sum += c;
    squares += c * c;
  }
  r.jain = squares > 0 ? sum * sum / (static_cast<double>(counts.size()) * squares) : 0;
  r.median_per_process = gpulock_bench::quantile(counts, 0.5);
  r.min_per_process = static_cast<std::size_t>(counts.front());
  r.max_per_process = static_cast<std::size_t>(counts.back());
  long long voluntary = 0;
  double cpu = 0;
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const rusage& ru = usage.at(workers[i]);
    voluntary += voluntary_delta(ru, before[i]);
    cpu += static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6 -
           static_cast<double>(before[i].runtime_ns) / 1e9;
  }
  r.voluntary_per_lease = all_leases ? static_cast<double>(voluntary) / all_leases : 0;
  r.cpu_per_lease_us = all_leases ? cpu / static_cast<double>(all_leases) * 1e6 : 0;
  return r;
}

// ---- main ----------------------------------------------------------------------------------

struct Options {
  int waiters = 64;
  int steps = 300;
  int rounds = 10;
  double idle_seconds = 10;
  double churn_seconds = 5;
  double warm_up = 0.5;
  std::int64_t max_hold_us = 2000;  // the third drain variant holds each lease 0..this long
  std::string only;                 // steps, drain, idle, churn, throughput, scale; "" = all
  std::vector<int> scale = {64, 256, 1024};  // processes in the scale part's churn runs
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: queue_bench [--waiters N] [--steps N] [--rounds N] [--idle-seconds S]\n"
               "                   [--churn-seconds S] [--only "
               "steps|drain|idle|churn|throughput|scale]\n"
               "                   [--hold-us N] [--verbose MS (list hand-offs slower than MS on "
               "stderr)]\n"
               "                   [--scale \"64 256 1024\" (processes in the scale part)]\n");
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) usage();
    const std::string value = argv[++i];
    if (arg == "--waiters")
      o.waiters = std::stoi(value);
    else if (arg == "--steps")
      o.steps = std::stoi(value);
    else if (arg == "--rounds")
      o.rounds = std::stoi(value);
    else if (arg == "--idle-seconds")
      o.idle_seconds = std::stod(value);
    else if (arg == "--churn-seconds")
      o.churn_seconds = std::stod(value);
    else if (arg == "--only")
      o.only = value;
    else if (arg == "--hold-us")
      o.max_hold_us = std::stoll(value);
    else if (arg == "--verbose")
      g_show_slower_ms = std::stod(value);
    else if (arg == "--scale") {
      o.scale.clear();
      std::istringstream sizes(value);
      for (int n = 0; sizes >> n;) o.scale.push_back(n);
      if (o.scale.empty() || !sizes.eof() ||
          std::any_of(o.scale.begin(), o.scale.end(), [](int n) { return n < 1; }))
        usage();
    } else
      usage();
  }
  return o;
}

// Issue 12: churn through 4 GPUs at each size, in process through the library, side by side with
// the same processes churning on bare flock(2) files (the floor), each pair in turn.
void run_scale(const Options& o) {
  std::printf(
      "\n5. Churn at scale, 4 GPUs, each process acquiring 1 GPU in process and releasing at "
      "once, %.0f s,\n   against the same processes handing 4 tokens round a ring of FIFOs (the "
      "floor of a fair\n   hand-off) and on 4 flock(2) files (aims: >= 2,000 leases/s at 64, no "
      "fall with N;\n   free-GPU idle time while someone waits <= 20 ms)\n",
      o.churn_seconds);
  std::printf("  %-6s %-8s %9s %10s %9s %9s %9s %9s %11s\n", "procs", "what", "leases/s",
              "CPU/lease", "Jain", "x gpulock", "p50 ms", "p99 ms", "max idle ms");
  std::fflush(stdout);
  for (int processes : o.scale) {
    const ChurnResult lib = run_churn(4, processes, o.churn_seconds, o.warm_up);
    const ChurnResult ring = run_churn(4, processes, o.churn_seconds, o.warm_up, "ring-churn");
    const ChurnResult floor = run_churn(4, processes, o.churn_seconds, o.warm_up, "flock-churn");
    const double lib_rate = static_cast<double>(lib.leases) / lib.seconds;
    const auto row = [&](const char* what, const ChurnResult& r) {
      const double rate = static_cast<double>(r.leases) / r.seconds;
      std::printf("  %-6d %-8s %9.0f %8.0f us %9.3f %9.2f %9.3f %9.3f %11.2f\n", processes, what,
                  rate, r.cpu_per_lease_us, r.jain, lib_rate > 0 ? rate / lib_rate : 0,
                  r.latency.p50, r.latency.p99, r.max_idle_ms);
    };
    row("gpulock", lib);
    row("ring", ring);
    row("flock", floor);
    std::fflush(stdout);
  }
  std::printf(
      "  (x gpulock: leases/s over gpulock's, same run; idle: longest release -> next lease of "
      "a GPU)\n");
}

int bench_main(const Options& o) {
  const auto wanted = [&](const char* name) {
    return o.only.empty() ? std::string_view(name) != "scale" : o.only == name;
  };
  std::printf("gpulock queue benchmarks: %d waiting processes, simulated GPUs, %ld CPUs\n\n",
              o.waiters, ::sysconf(_SC_NPROCESSORS_ONLN));
  std::fflush(stdout);

  if (wanted("steps") || wanted("drain") || wanted("churn") || wanted("throughput")) {
    std::printf("1. Hand-off latency: holder's release() -> next holder's acquire() returns\n");
    std::printf("   (aims: p50 <= 1 ms, p99 <= 10 ms)\n");
    print_latency_header();
    std::fflush(stdout);
  }
  std::optional<StepResult> steps;
  if (wanted("steps")) {
    steps = run_steps(o.waiters, o.steps);
    print_latency("step, 1 GPU, " + std::to_string(o.waiters) + " asleep", steps->latency);
    std::fflush(stdout);
  }
  std::vector<double> drain_voluntary;  // 1 GPU, 4 GPUs
  if (wanted("drain")) {
    struct Variant {
      unsigned gpus;
      std::int64_t max_hold_us;
    };
    std::vector<Variant> variants = {{1, 0}, {4, 0}};
    if (o.max_hold_us > 0) variants.push_back({1, o.max_hold_us});
    for (const Variant& v : variants) {
      std::vector<double> latency;
      double voluntary = 0;
      for (int round = 0; round < o.rounds; ++round) {
        const DrainResult d = run_drain(v.gpus, o.waiters, 0, v.max_hold_us);
        latency.insert(latency.end(), d.latency.begin(), d.latency.end());
        voluntary += d.voluntary_per_handoff;
      }
      if (v.max_hold_us == 0) drain_voluntary.push_back(voluntary / o.rounds);
      std::string name = "drain, " + std::to_string(v.gpus) + " GPU" + (v.gpus > 1 ? "s" : "") +
                         ", " + std::to_string(o.waiters) + "->0";
      if (v.max_hold_us > 0)
        name +=
            ", hold 0-" + (v.max_hold_us % 1000 == 0 ? std::to_string(v.max_hold_us / 1000) + " ms"
                                                     : std::to_string(v.max_hold_us) + " us");
      print_latency(name, latency_of(latency));
      std::fflush(stdout);
    }
  }
  std::optional<ChurnResult> churn1;
  if (wanted("churn")) {
    churn1 = run_churn(1, o.waiters + 1, o.churn_seconds, o.warm_up);
    print_latency("churn, 1 GPU, " + std::to_string(o.waiters + 1) + " processes", churn1->latency);
    std::fflush(stdout);
  }
  std::optional<ChurnResult> churn4;
  if (wanted("throughput")) {
    churn4 = run_churn(4, o.waiters, o.churn_seconds, o.warm_up);
    print_latency("churn, 4 GPUs, " + std::to_string(o.waiters) + " processes", churn4->latency);
    std::fflush(stdout);
  }

  if (wanted("idle")) {
    std::printf("\n2. %d idle waiters behind a held GPU for %.0f s (aim: < 0.1 CPU-s in total)\n",
                o.waiters, o.idle_seconds);
    std::fflush(stdout);
    const DrainResult d = run_drain(1, o.waiters, o.idle_seconds, 0);
    std::printf("  CPU (utime+stime): %.3f s   CPU (schedstat run time): %.4f s\n",
                d.idle_cpu_ticks_s, d.idle_runtime_s);
    std::printf(
        "  wake-ups (voluntary context switches): %lld in all, %d of %d waiters woke; "
        "involuntary: %lld\n",
        d.idle_voluntary, d.idle_woke, o.waiters, d.idle_involuntary);
    std::string woke;
    for (std::size_t i = 0; i < d.idle_voluntary_by_position.size(); ++i)
      if (d.idle_voluntary_by_position[i] > 0)
        woke += " position " + std::to_string(i + 1) + ": " +
                std::to_string(d.idle_voluntary_by_position[i]) + ";";
    if (!woke.empty()) std::printf("  who woke:%s\n", woke.c_str());
  }

  if (steps || !drain_voluntary.empty() || churn1 || churn4) {
    std::printf("\n3. Wake-ups (voluntary context switches of the waiting processes)\n");
    if (steps) {
      std::printf(
          "  step, per hand-off: other waiters %.2f (p50 %.0f, max %.0f) in %.2f processes "
          "(max %.0f); new holder %.2f\n",
          steps->others_per_handoff.mean, steps->others_per_handoff.p50,
          steps->others_per_handoff.max, steps->distinct_per_handoff.mean,
          steps->distinct_per_handoff.max, steps->new_holder.mean);
      std::printf(
          "  step, per arrival (the old holder queues again): other waiters %.2f (max %.0f) in "
          "%.2f "
          "processes (max %.0f)\n",
          steps->others_per_arrival.mean, steps->others_per_arrival.max,
          steps->distinct_per_arrival.mean, steps->distinct_per_arrival.max);
      std::printf("  step, who woke at hand-offs (queue position before it; 1 was served): %s\n",
                  positions(steps->woke_at_handoff).c_str());
      std::printf("  step, who woke at arrivals: %s\n", positions(steps->woke_at_arrival).c_str());
      std::printf("  step, hand-offs not to the oldest waiter: %d of %zu\n", steps->out_of_order,
                  steps->latency.n);
    }
    if (drain_voluntary.size() == 2)
      std::printf(
          "  drain, per hand-off, all waiters (own acquisition included): 1 GPU %.2f, "
          "4 GPUs %.2f\n",
          drain_voluntary[0], drain_voluntary[1]);
    if (churn1)
      std::printf(
          "  churn, 1 GPU, per lease, all processes (own acquire, release and "
          "re-queueing included): %.2f\n",
          churn1->voluntary_per_lease);
    if (churn4)
      std::printf("  churn, 4 GPUs, per lease, all processes: %.2f\n", churn4->voluntary_per_lease);
  }

  if (churn4) {
    std::printf(
        "\n4. Leases per second, 4 GPUs, %d processes each acquiring and releasing at "
        "once, %.0f s\n",
        o.waiters, churn4->seconds);
    std::printf("  leases: %zu   leases/s: %.0f   CPU per lease (all processes): %.0f us\n",
                churn4->leases, static_cast<double>(churn4->leases) / churn4->seconds,
                churn4->cpu_per_lease_us);
    std::printf("  per process: min %zu, median %.0f, max %zu; Jain fairness index %.3f\n",
                churn4->min_per_process, churn4->median_per_process, churn4->max_per_process,
                churn4->jain);
  }
  if (churn1) {
    std::printf(
        "  (1 GPU, %d processes: %zu leases, %.0f leases/s; per process min %zu, max "
        "%zu)\n",
        o.waiters + 1, churn1->leases, static_cast<double>(churn1->leases) / churn1->seconds,
        churn1->min_per_process, churn1->max_per_process);
  }
  if (wanted("scale")) run_scale(o);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 8 && std::strcmp(argv[1], "--worker") == 0)
      return worker_main(argv[2], std::stoi(argv[3]), static_cast<unsigned>(std::stoul(argv[4])),
                         argv[5], argv[6], std::stoll(argv[7]));
    return bench_main(parse_options(argc, argv));
  } catch (const std::exception& error) {
    std::fprintf(stderr, "queue_bench%s: %s\n",
                 argc > 1 && std::strcmp(argv[1], "--worker") == 0
                     ? (std::string(" worker ") + argv[3]).c_str()
                     : "",
                 error.what());
    return 1;
  }
}
