// Selection and waiting options shared by `run` and `acquire`.
#include <fcntl.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

// A CLI11 validator that runs one of the library's parsers, so a malformed or empty value is a
// usage error (exit 64) at parse time, with the parser's own message.
template <typename Parser>
CLI::Validator parsed_by(Parser parser, const char* name) {
  return CLI::Validator(
      [parser](std::string& value) -> std::string {
        try {
          parser(value);
          return "";
        } catch (const Error& error) {
          return error.what();
        }
      },
      name);
}

}  // namespace

CLI::Validator duration_check() {
  return parsed_by(parse_duration, "DURATION");
}

void RequestOptions::add_to(CLI::App& command) {
  auto* count_option =
      command.add_option("-n,--count", count, "Number of GPUs to lease (any suitable ones)")
          ->capture_default_str();
  auto* gpus_option =
      command.add_option("--gpus", gpus, "Lease exactly these GPUs: indices or UUIDs, e.g. 0,2")
          ->check(parsed_by(parse_gpu_list, "LIST"));
  count_option->excludes(gpus_option);
  command
      .add_option("--min-free-mem", min_free_mem, "Only GPUs with this much free memory, e.g. 20G")
      ->check(parsed_by(parse_size, "SIZE"));
  command
      .add_option("--mem", mem,
                  "A shared lease: this much memory of each GPU (e.g. 10G) instead of whole GPUs")
      ->check(parsed_by(parse_size, "SIZE"));
  command
      .add_option("--slots", slots,
                  "A shared lease on a GPU with at most N shared leases (with this one); "
                  "without --mem, 1/N of its memory")
      ->check(CLI::Range(1u, 1024u));
  command.add_flag("--spread", spread,
                   "Shared leases: prefer the emptiest GPUs (default: fill partly used ones)");
  command.add_option("--max-util", max_util, "Only GPUs at most this busy, in percent")
      ->check(parsed_by(parse_percent, "PCT"));
  command.add_option("--max-power", max_power, "Only GPUs drawing at most this power, in watts")
      ->check(parsed_by(parse_watts, "W"));
  command.add_flag("--allow-foreign", allow_foreign,
                   "Accept GPUs with compute processes of people not using gpulock");
  auto* timeout_option =
      command.add_option("--timeout", timeout, "Wait at most this long, e.g. 90s, 5m, 2h")
          ->check(parsed_by(parse_duration, "DURATION"));
  auto* no_wait_option =
      command.add_flag("--no-wait", no_wait, "Fail at once if the GPUs are not free");
  timeout_option->excludes(no_wait_option);
  command.add_option("--label", label, "A note shown by `gpulock status`");
  command
      .add_option("--priority", priority,
                  "normal, or low: wait behind every normal request (background sweeps)")
      ->check(CLI::IsMember({"normal", "low"}))
      ->capture_default_str();
  command.add_option("--visible", visible, "How CUDA_VISIBLE_DEVICES names GPUs: index or uuid")
      ->check(CLI::IsMember({"index", "uuid"}))
      ->capture_default_str();
  command.add_flag("-v,--verbose", verbose, "Say which GPUs were leased");
  command.add_flag("-q,--quiet", quiet, "Say nothing while waiting (errors are still printed)");
  add_backend_option(command, backend);
  command.add_option(
      "--host", hosts,
      "Redis backend: the hosts whose GPUs may serve it (names, or any); default "
      "this host. Another host's GPUs are a reservation (GPULOCK_LEASE_HOST names it)");
}

void add_backend_option(CLI::App& command, std::string& backend) {
  command.add_option("--backend", backend,
                     "file, or redis://[user:password@]host:port/db (default: GPULOCK_BACKEND, "
                     "then the config's backend, then file)");
}

GpuPool open_pool(const std::string& backend) {
  PoolOptions options;
  if (!backend.empty()) options.backend = backend;
  return GpuPool::open(std::move(options));
}

LeaseRequest RequestOptions::to_request() const {
  LeaseRequest request;
  request.count = count;
  if (!gpus.empty()) request.gpus = parse_gpu_list(gpus);
  if (!min_free_mem.empty()) request.min_free_memory_bytes = parse_size(min_free_mem);
  if (!max_util.empty()) request.max_utilization_percent = parse_percent(max_util);
  if (!max_power.empty()) request.max_power_watts = parse_watts(max_power);
  request.allow_foreign_processes = allow_foreign;
  if (!mem.empty()) request.memory_bytes = parse_size(mem);
  if (slots > 0) request.slots = slots;
  request.spread = spread;
  if (!timeout.empty()) request.timeout = parse_duration(timeout);
  request.wait = !no_wait;
  request.label = label;
  request.priority = parse_priority(priority);
  if (const char* visible_now = std::getenv("CUDA_VISIBLE_DEVICES"); visible_now != nullptr)
    request.cuda_visible_devices = visible_now;
  if (const char* lease = std::getenv("GPULOCK_LEASE_ID"); lease != nullptr && *lease != '\0')
    request.enclosing_lease_id = lease;
  if (!hosts.empty()) request.hosts = parse_gpu_list(hosts);  // the same comma-separated form
  return request;
}

VisibleFormat RequestOptions::visible_format() const {
  return visible == "uuid" ? VisibleFormat::kUuid : VisibleFormat::kIndex;
}

namespace {

// Ctrl-C while a command waits for GPUs (outside a job): the wait ends, and gpulock says that
// nothing is held instead of leaving a bare ^C.
int interrupt_pipe[2] = {-1, -1};
volatile sig_atomic_t interrupt_seen = 0;
void on_interrupt(int) {
  interrupt_seen = 1;
  if (interrupt_pipe[1] >= 0) {
    const int saved = errno;
    [[maybe_unused]] const ssize_t n = ::write(interrupt_pipe[1], "x", 1);
    errno = saved;
  }
}

// Catches SIGINT for as long as it lives, unless SIGINT is ignored (a script's background job
// inherits it so, and must stay deaf to Ctrl-C); puts the old disposition back after.
class InterruptWhileWaiting {
 public:
  InterruptWhileWaiting() {
    struct sigaction old {};
    if (::sigaction(SIGINT, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return;
    if (::pipe2(interrupt_pipe, O_NONBLOCK | O_CLOEXEC) != 0) return;
    struct sigaction catching {};
    catching.sa_handler = on_interrupt;  // no SA_RESTART: a blocking call returns EINTR
    sigemptyset(&catching.sa_mask);
    active_ = ::sigaction(SIGINT, &catching, &previous_) == 0;
  }
  ~InterruptWhileWaiting() {
    if (active_) ::sigaction(SIGINT, &previous_, nullptr);
    for (int& fd : interrupt_pipe)
      if (fd >= 0) ::close(std::exchange(fd, -1));
  }
  InterruptWhileWaiting(const InterruptWhileWaiting&) = delete;
  InterruptWhileWaiting& operator=(const InterruptWhileWaiting&) = delete;
  bool active() const { return active_; }

 private:
  struct sigaction previous_ {};
  bool active_ = false;
};

// After Ctrl-C: the message, then death by SIGINT, so that the shell sees it (a loop of gpulock
// commands stops; $? is 130).
// A command whose output a shell runs (acquire for eval) first prints what stops that shell.
[[noreturn]] void gave_up_waiting() {
  print_error("gave up waiting (Ctrl-C): nothing is held");
  std::fflush(stderr);
  if (output_on_failure) {
    fmt::print("{}", output_on_failure(128 + SIGINT));
    std::fflush(stdout);
  }
  die_by_signal(SIGINT);
}

}  // namespace

void die_by_signal(int number) {
  ::signal(number, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, number);
  ::sigprocmask(SIG_UNBLOCK, &only, nullptr);
  ::raise(number);
  ::_exit(128 + number);
}

Lease acquire_for_cli(GpuPool& pool, const RequestOptions& options, const std::string& command,
                      const std::function<void(const WaitProgress&)>& also_on_progress,
                      const std::function<bool()>& interrupted, int interrupt_fd) {
  LeaseRequest request = options.to_request();
  request.command = command;
  for (const auto& warning : pool.warnings()) print_error("warning: " + warning);
  const std::size_t wanted = request.gpus.empty() ? request.count : request.gpus.size();
  // A live line is drawn (and cleared) only in the foreground of our terminal: a background
  // job must not erase the foreground one's line.
  const bool terminal =
      !options.quiet && ::isatty(STDERR_FILENO) != 0 && ::tcgetpgrp(STDERR_FILENO) == ::getpgrp();
  Lease lease;
  try {
    std::string what = fmt::format("{} GPU{}", wanted, wanted == 1 ? "" : "s");
    if (request.memory_bytes) {
      what = format_size(*request.memory_bytes) + " on " + what;
    } else if (request.slots) {
      what = fmt::format("1/{} of {}", *request.slots, what);
    }
    WaitHooks hooks = make_wait_display(what, options.quiet);
    std::optional<InterruptWhileWaiting> ctrl_c;
    if (!interrupted && ctrl_c.emplace().active()) {
      interrupt_seen = 0;
      hooks.interrupted = [] { return interrupt_seen != 0; };
      hooks.interrupt_fd = interrupt_pipe[0];
      hooks.interrupt_poll = std::chrono::minutes(5);
    } else if (interrupted) {
      hooks.interrupted = interrupted;
      // A signal ends the wait's sleep at once; the poll bounds the delay for one that lands
      // just before a sleep starts. With a self-pipe (interrupt_fd) there is no such race, and
      // the poll only stands in for a mark nobody signalled (a cancel that found no pid).
      hooks.interrupt_fd = interrupt_fd;
      hooks.interrupt_poll = interrupt_fd >= 0 ? std::chrono::minutes(5) : std::chrono::seconds(10);
    }
    if (also_on_progress)
      hooks.on_progress = [display = hooks.on_progress, also_on_progress](const WaitProgress& p) {
        display(p);
        also_on_progress(p);
      };
    lease = pool.acquire(request, hooks);
  } catch (...) {
    if (terminal) fmt::print(stderr, "\r\033[K");  // clear the live waiting line
    if (interrupt_seen) gave_up_waiting();
    throw;
  }
  if (terminal) fmt::print(stderr, "\r\033[K");
  if (interrupt_seen) {  // Ctrl-C as the lease came: it is not wanted any more
    lease.release();
    gave_up_waiting();
  }
  if (options.verbose || terminal) {
    std::string which;
    for (const auto& gpu : lease.gpus()) which += (which.empty() ? "" : ", ") + gpu.display_index;
    print_error(fmt::format(
        "leased GPU{} {}{} as lease {}{}", lease.gpus().size() == 1 ? "" : "s", which,
        lease.host().empty() ? "" : " of host " + lease.host(), lease.id(),
        pool.device_source().simulated() ? " (" + pool.device_source().description() + ")" : ""));
  }
  return lease;
}

void print_error(const std::string& message) {
  fmt::print(stderr, "gpulock: {}\n", message);
}

}  // namespace gpulock::cli
