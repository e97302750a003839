// run_command(): fork/exec under a lease, forwarding signals and passing the lock descriptors.
#include <fcntl.h>
#ifdef __GLIBC__
#include <gnu/libc-version.h>
#endif
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "gpulock/run.hpp"
#include "util/fd.h"

extern char** environ;

namespace gpulock {
namespace {

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// Whether posix_spawn's dup2 of a descriptor onto itself clears its close-on-exec flag, as POSIX
// asks: glibc does since 2.29 (bug 23640); older ones leave the flag, and the command would start
// without the lease's locks. Elsewhere (another C library) the flag is cleared by hand.
bool spawn_dup2_onto_itself_clears_cloexec() {
#ifdef __GLIBC__
  static const bool clears = [] {
    unsigned major = 0, minor = 0;
    return std::sscanf(gnu_get_libc_version(), "%u.%u", &major, &minor) == 2 &&
           (major > 2 || (major == 2 && minor >= 29));
  }();
  return clears;
#else
  return false;
#endif
}

// Throws for a posix_spawn set-up call that failed (they return the error number).
void check_spawn_setup(int error, const char* call) {
  if (error != 0) throw Error(ErrorCode::kInternal, errno_message(call, error));
}

std::vector<std::string> build_environment(const Lease& lease, VisibleFormat format) {
  const auto overrides = lease_environment(lease, format);
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const auto& [name, value] : overrides) {
      (void)value;
      if (entry.compare(0, name.size() + 1, name + "=") == 0) replaced = true;
    }
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
  return env;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> lease_environment(const Lease& lease,
                                                                   VisibleFormat format) {
  std::vector<std::pair<std::string, std::string>> env{
      {"CUDA_VISIBLE_DEVICES", lease.cuda_visible_devices(format)},
      {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
      {"GPULOCK_LEASE_ID", lease.id()},
      {"GPULOCK_GPUS", lease.uuid_list()}};
  if (const std::uint64_t memory = lease.memory_bytes(); memory > 0) {
    // A shared lease: what frameworks honour to stay within it (cooperative, not a fence).
    env.emplace_back("GPULOCK_MEMORY_LIMIT_BYTES", std::to_string(memory));
    double fraction = 1;
    for (const auto& gpu : lease.gpus())
      if (gpu.memory_total_bytes > 0)
        fraction = std::min(
            fraction, static_cast<double>(memory) / static_cast<double>(gpu.memory_total_bytes));
    // Rounded down, so that the framework's share never exceeds the reservation.
    env.emplace_back("XLA_PYTHON_CLIENT_MEM_FRACTION",
                     fmt::format("{:.3f}", std::floor(fraction * 1000) / 1000));
    env.emplace_back("XLA_PYTHON_CLIENT_PREALLOCATE", "false");
    env.emplace_back("TF_FORCE_GPU_ALLOW_GROWTH", "true");
  }
  if (lease.fencing_token() != 0) {
    env.emplace_back("GPULOCK_FENCING_TOKEN", std::to_string(lease.fencing_token()));
    env.emplace_back("GPULOCK_LEASE_HOST", lease.host());
  }
  return env;
}

namespace {

// The signals run_command() reads from a signalfd while the command runs (blocked for this
// thread meanwhile), and SIGCHLD's default action: both as they were again once it is gone.
class CommandSignals {
 public:
  CommandSignals() {
    sigemptyset(&handled_);
    for (int s : kForwardedSignals) sigaddset(&handled_, s);
    sigaddset(&handled_, SIGCHLD);
    // Read, not forwarded: a process stopped past its Redis lease's TTL learns of the loss from
    // the clock the moment it continues (SIGSTOP cannot be caught; the SIGCONT that ends it can).
    sigaddset(&handled_, SIGCONT);
    // If SIGCHLD was inherited as ignored, the kernel would reap the command itself and never
    // tell us it ended: take the default back.
    struct sigaction default_chld {};
    default_chld.sa_handler = SIG_DFL;
    ::sigaction(SIGCHLD, &default_chld, &previous_chld_);
    if (::sigprocmask(SIG_BLOCK, &handled_, &caller_mask_) != 0) {
      const int error = errno;
      ::sigaction(SIGCHLD, &previous_chld_, nullptr);
      throw Error(ErrorCode::kInternal, errno_message("sigprocmask", error));
    }
    fd_ = UniqueFd(::signalfd(-1, &handled_, SFD_CLOEXEC));
    if (!fd_) {
      const int error = errno;
      restore();
      throw Error(ErrorCode::kInternal, errno_message("signalfd", error));
    }
  }
  ~CommandSignals() {
    fd_ = UniqueFd();
    restore();
  }
  CommandSignals(const CommandSignals&) = delete;
  CommandSignals& operator=(const CommandSignals&) = delete;

  int fd() const { return fd_.get(); }
  // The caller's signal mask, which the command starts with.
  const sigset_t& caller_mask() const { return caller_mask_; }

 private:
  void restore() {
    ::sigprocmask(SIG_SETMASK, &caller_mask_, nullptr);
    ::sigaction(SIGCHLD, &previous_chld_, nullptr);
  }

  sigset_t handled_{};
  sigset_t caller_mask_{};
  struct sigaction previous_chld_ {};
  UniqueFd fd_;
};

// How run_command() hears that its lease was lost: the keeper's thread reports it through an
// eventfd (Redis backend), and the loss is said once, by whoever learns of it first (that thread,
// or run_command() reading the lease's clock after a pause: the command may be gone before the
// thread runs).
class LossWatch {
 public:
  LossWatch(Lease& lease, LeaseLossAction on_loss)
      : lease_(lease),
        // Shared with the callback, so that a late call never writes to a closed descriptor.
        fd_(std::make_shared<UniqueFd>(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK))),
        announced_(std::make_shared<std::atomic<bool>>(false)),
        id_(lease.id()),
        on_loss_(on_loss) {
    if (!*fd_) throw Error(ErrorCode::kInternal, errno_message("eventfd", errno));
    lease.on_lost([fd = fd_, announced = announced_, id = id_, on_loss](const std::string& reason) {
      say(*announced, id, on_loss, reason);
      const std::uint64_t one = 1;
      [[maybe_unused]] const ssize_t n = ::write(fd->get(), &one, sizeof one);
    });
  }
  ~LossWatch() { lease_.on_lost(nullptr); }
  LossWatch(const LossWatch&) = delete;
  LossWatch& operator=(const LossWatch&) = delete;

  int fd() const { return fd_->get(); }
  void drain() const {
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(fd_->get(), &count, sizeof count);
  }
  void announce(const std::string& reason) const { say(*announced_, id_, on_loss_, reason); }

 private:
  static void say(std::atomic<bool>& announced, const std::string& id, LeaseLossAction on_loss,
                  const std::string& reason) {
    if (announced.exchange(true)) return;
    std::fprintf(stderr, "gpulock: warning: lease %s lost: %s. %s\n", id.c_str(), reason.c_str(),
                 on_loss == LeaseLossAction::kKill
                     ? "Stopping the command (--on-lease-loss=kill)."
                     : "The command keeps running, but its GPUs may be given to others.");
  }

  Lease& lease_;
  std::shared_ptr<UniqueFd> fd_;
  std::shared_ptr<std::atomic<bool>> announced_;
  std::string id_;
  LeaseLossAction on_loss_;
};

// The posix_spawn set-up of a command: its descriptors and attributes, destroyed with it.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  SpawnSetup() {
    if (::posix_spawn_file_actions_init(&actions) != 0)
      throw Error(ErrorCode::kInternal, "cannot prepare to start the command");
    if (::posix_spawnattr_init(&attributes) != 0) {
      ::posix_spawn_file_actions_destroy(&actions);
      throw Error(ErrorCode::kInternal, "cannot prepare to start the command");
    }
  }
  ~SpawnSetup() {
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attributes);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

// Where the spawn cannot clear it, the lock descriptors lose close-on-exec for the moment of the
// spawn (no other thread of ours starts programs meanwhile), and get it back after.
struct InheritedByTheSpawn {
  std::span<const int> fds;
  bool cleared = false;
  ~InheritedByTheSpawn() {
    if (cleared)
      for (int fd : fds) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
};

// fork and exec, for a command that must die with the runner (posix_spawn cannot ask for a
// death signal): in the child only async-signal-safe steps before exec. Returns the error of
// the exec, or 0.
int fork_with_death_signal(Lease& lease, std::vector<char*>& args, std::vector<char*>& envp,
                           const sigset_t& mask, pid_t* child) {
  const pid_t runner = ::getpid();
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0)
    throw Error(ErrorCode::kInternal, errno_message("pipe2", errno));
  *child = ::fork();
  if (*child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != runner) ::_exit(137);  // the runner died before the line above
    for (int fd : lease.lock_fds()) ::fcntl(fd, F_SETFD, 0);
    ::signal(SIGPIPE, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    ::execvpe(args[0], args.data(), envp.data());
    const int error = errno;
    [[maybe_unused]] const ssize_t n = ::write(ready[1], &error, sizeof error);
    ::_exit(127);
  }
  ::close(ready[1]);
  int spawn_error = 0;
  if (*child < 0) {
    spawn_error = errno;
  } else {
    int error = 0;
    ssize_t n;
    while ((n = ::read(ready[0], &error, sizeof error)) < 0 && errno == EINTR) {
    }
    if (n == static_cast<ssize_t>(sizeof error)) {
      spawn_error = error;
      ::waitpid(*child, nullptr, 0);
    }
  }
  ::close(ready[0]);
  return spawn_error;
}

// Starts the command with the lease's lock descriptors inherited. Returns the error number of
// a command that could not be started, or 0 with its pid in *child.
//
// posix_spawn (a vfork-like clone in glibc) rather than fork: it neither copies our page tables
// nor leaves our pages copy-on-write, which made fork most of what `gpulock run` cost between
// taking its GPUs and the command's start. The command inherits the lease's lock descriptors (a
// dup2 of a descriptor onto itself clears its close-on-exec flag), starts with default SIGPIPE
// handling even if our caller ignores it (the CLI does, to see write errors; ignored signals
// would otherwise survive exec), and with our caller's signal mask (`mask`).
int spawn_command(Lease& lease, std::vector<char*>& args, std::vector<char*>& envp,
                  const sigset_t& mask, bool dies_with_runner, pid_t* child) {
  SpawnSetup setup;
  InheritedByTheSpawn inherited{lease.lock_fds()};
  if (spawn_dup2_onto_itself_clears_cloexec()) {
    for (int fd : lease.lock_fds())
      check_spawn_setup(::posix_spawn_file_actions_adddup2(&setup.actions, fd, fd),
                        "posix_spawn_file_actions_adddup2");
  } else {
    inherited.cleared = true;
    for (int fd : lease.lock_fds())
      if (::fcntl(fd, F_SETFD, 0) != 0)
        throw Error(ErrorCode::kInternal, errno_message("fcntl(F_SETFD)", errno));
  }
  sigset_t default_signals;
  sigemptyset(&default_signals);
  sigaddset(&default_signals, SIGPIPE);
#ifdef __GLIBC__
  // glibc's posix_spawn sets its two internal signals (SIGRTMIN - 2 and - 1: 32 and 33) to
  // ignored in the child, and an ignored signal stays ignored across exec; listed here, they
  // are set to default instead. sigaddset refuses them, so their bits are set by hand.
  for (const int internal : {32, 33}) {
    constexpr std::size_t kBits = 8 * sizeof default_signals.__val[0];
    default_signals.__val[(internal - 1) / kBits] |= 1UL << ((internal - 1) % kBits);
  }
#endif
  check_spawn_setup(::posix_spawnattr_setsigdefault(&setup.attributes, &default_signals),
                    "posix_spawnattr_setsigdefault");
  check_spawn_setup(::posix_spawnattr_setsigmask(&setup.attributes, &mask),
                    "posix_spawnattr_setsigmask");
  check_spawn_setup(
      ::posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK),
      "posix_spawnattr_setflags");
  if (dies_with_runner) return fork_with_death_signal(lease, args, envp, mask, child);
  int spawn_error =
      ::posix_spawnp(child, args[0], &setup.actions, &setup.attributes, args.data(), envp.data());
  if (spawn_error == ENOEXEC) {
    // A script without "#!": a shell runs it with /bin/sh, as execvp does and posix_spawnp
    // (since glibc 2.28) does not. The shell finds the program as we would have.
    std::vector<char*> through_shell = {const_cast<char*>("sh"), const_cast<char*>("-c"),
                                        const_cast<char*>("exec \"$0\" \"$@\"")};
    through_shell.insert(through_shell.end(), args.begin(), args.end());
    spawn_error = ::posix_spawn(child, "/bin/sh", &setup.actions, &setup.attributes,
                                through_shell.data(), envp.data());
  }
  return spawn_error;
}

// The milliseconds from now until `when`, at least 0, for poll().
int ms_until(std::chrono::steady_clock::time_point when) {
  return static_cast<int>(std::max<long long>(
      0,
      std::chrono::duration_cast<std::chrono::milliseconds>(when - std::chrono::steady_clock::now())
          .count()));
}

// Waits for the started command to end, forwarding signals, acting on a lost lease and on what
// `check` asks. Returns its exit status (128 + the signal that killed it).
int supervise(Lease& lease, pid_t child, const CommandSignals& signals, const LossWatch& loss,
              LeaseLossAction on_loss, const std::function<bool()>& check,
              std::chrono::milliseconds check_period) {
  using Clock = std::chrono::steady_clock;
  bool killing = false;
  bool check_stopped = false;
  Clock::time_point kill_at;
  auto next_check = Clock::now() + check_period;
  bool loss_seen = false;
  const auto stop_command = [&] {
    ::kill(child, SIGTERM);
    killing = true;
    kill_at = Clock::now() + std::chrono::seconds(kLeaseLossGraceSeconds);
  };
  const auto act_on_loss = [&] {
    if (loss_seen) return;
    loss_seen = true;
    if (on_loss == LeaseLossAction::kKill) stop_command();
  };
  while (true) {
    // The lease's own clock first: after a pause past the TTL, the keeper's thread may not have
    // run yet to report the loss, but the lease is lost already.
    if (!loss_seen && lease.lost()) {
      loss.announce("no renewal was confirmed for a whole TTL");
      act_on_loss();
    }
    pollfd waits[2] = {{signals.fd(), POLLIN, 0}, {loss.fd(), POLLIN, 0}};
    int timeout_ms = -1;
    if (killing) timeout_ms = ms_until(kill_at);
    if (check && !check_stopped)
      timeout_ms =
          timeout_ms < 0 ? ms_until(next_check) : std::min(timeout_ms, ms_until(next_check));
    if (::poll(waits, 2, timeout_ms) < 0 && errno != EINTR)
      throw Error(ErrorCode::kInternal, errno_message("poll", errno));
    if (waits[1].revents & POLLIN) {
      loss.drain();
      act_on_loss();
    }
    if (check && !check_stopped && Clock::now() >= next_check) {
      next_check = Clock::now() + check_period;
      if (check() && !killing) {
        check_stopped = true;
        stop_command();
      }
    }
    if (killing && Clock::now() >= kill_at) {
      ::kill(child, SIGKILL);
      killing = false;
    }
    if (!(waits[0].revents & POLLIN)) continue;
    signalfd_siginfo info{};
    const ssize_t n = ::read(signals.fd(), &info, sizeof info);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof info))
      throw Error(ErrorCode::kInternal, errno_message("read(signalfd)", errno));
    if (info.ssi_signo == SIGCONT) continue;  // the loop's first step checks the lease
    if (info.ssi_signo == SIGCHLD) {
      int status = 0;
      if (::waitpid(child, &status, WNOHANG) != child) continue;
      CommandOutcome outcome;
      if (WIFEXITED(status)) {
        outcome.exit_status = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        outcome.how = CommandEnd::kSignal;
        outcome.signal = WTERMSIG(status);
        outcome.exit_status = 128 + outcome.signal;
      } else {
        continue;  // stopped or continued: not the end
      }
      // Whatever way it ended, a command stopped for a lost lease ended for that.
      if (loss_seen && on_loss == LeaseLossAction::kKill) outcome.how = CommandEnd::kLeaseLost;
      lease.set_outcome(outcome);
      return outcome.exit_status;
    }
    // A terminal sends SIGINT/SIGQUIT to the whole foreground process group (si_code SI_KERNEL):
    // when the command is in our group it has it already, and forwarding would deliver it twice.
    // But a command that left our group (setsid, `timeout`) did not get it, and a hang-up of a
    // terminal whose session we lead reaches only us: those are forwarded.
    const bool hang_up_of_our_session = info.ssi_signo == SIGHUP && ::getsid(0) == ::getpid();
    if (info.ssi_code == SI_KERNEL && ::getpgid(child) == ::getpgrp() && !hang_up_of_our_session)
      continue;
    ::kill(child, static_cast<int>(info.ssi_signo));
  }
}

}  // namespace

int run_command(Lease& lease, const std::vector<std::string>& argv, VisibleFormat format,
                LeaseLossAction on_loss, const std::function<bool()>& check,
                std::chrono::milliseconds check_period, bool dies_with_runner) {
  if (argv.empty()) throw Error(ErrorCode::kInvalidArgument, "no command to run");

  // Prepare everything the child needs before forking: after fork it only execs.
  const std::vector<std::string> env_strings = build_environment(lease, format);
  std::vector<char*> envp, args;
  for (const auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  const CommandSignals signals;
  const LossWatch loss(lease, on_loss);
  pid_t child = -1;
  const int spawn_error =
      spawn_command(lease, args, envp, signals.caller_mask(), dies_with_runner, &child);
  if (spawn_error != 0) {
    // As a shell says it: 127 when the program is not found, 126 when it cannot be run.
    std::fprintf(stderr, "gpulock: cannot run '%s': %s\n", argv[0].c_str(),
                 std::strerror(spawn_error));
    const int status = spawn_error == ENOENT ? 127 : 126;
    lease.set_outcome(CommandOutcome{CommandEnd::kExited, status, 0});
    return status;
  }
  lease.set_holder(::getpid(), "run", child);
  return supervise(lease, child, signals, loss, on_loss, check, check_period);
}

}  // namespace gpulock
