// detach_lease(): a daemon-like holder that keeps a lease until the processes it is held for
// are gone: one watched process, or every process of the caller's session.
//
// The holder is a grandchild in its own session, with stdin/stdout/stderr on /dev/null (so
// `eval "$(gpulock acquire …)"` is not kept waiting) and every descriptor but the lease's closed.
// It sleeps in poll() on pidfds of the watched processes (process/owner_watch.h) and a signalfd
// for SIGTERM/SIGINT/SIGHUP, so it costs nothing while it waits and wakes at once when either
// happens.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <set>

#include <fmt/format.h>

#include "backend/lease_state.h"
#include "gpulock/error.hpp"
#include "gpulock/run.hpp"
#include "process/owner_watch.h"
#include "process/process_identity.h"
#include "util/fd.h"
#include "util/helper_threads.h"

namespace gpulock {
namespace {

// Closes every descriptor from 3 up but those in `keep`: with close_range(), a call per gap
// between kept descriptors (a loop over every possible descriptor cost the holder up to 65,536
// close() calls, 20-40 ms, where the limit on open files is high); one by one on kernels
// before 5.9.
void close_all_except(const std::set<int>& keep) {
  unsigned first = 3;
  bool ranges = true;
  for (const int fd : keep) {
    if (fd < static_cast<int>(first)) continue;
    if (fd > static_cast<int>(first) &&
        ::close_range(first, static_cast<unsigned>(fd) - 1, 0) != 0) {
      ranges = false;
      break;
    }
    first = static_cast<unsigned>(fd) + 1;
  }
  if (ranges && ::close_range(first, ~0U, 0) == 0) return;
  const long limit = std::min<long>(::sysconf(_SC_OPEN_MAX), 65536);
  for (int fd = 3; fd < limit; ++fd)
    if (!keep.contains(fd)) ::close(fd);
}

[[noreturn]] void hold_until_done(Lease& lease, LeaseKeeper* keeper, LeaseJournalDebt* journal,
                                  OwnerWatch& owners, pid_t watched_pid, int ready_fd) {
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    if (null_fd > 2) ::close(null_fd);
  }
  if (::chdir("/") != 0) {
    // Staying in the caller's directory only keeps it busy; nothing to do about it.
  }
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  ::sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
  const int signals = ::signalfd(-1, &stop_signals, SFD_CLOEXEC);

  std::set<int> keep(lease.lock_fds().begin(), lease.lock_fds().end());
  keep.insert({ready_fd, signals});
  for (const int fd : owners.descriptors()) keep.insert(fd);
  close_all_except(keep);
  if (journal && journal->journal) journal->journal->forget_descriptors();
  // A lease that is renewed (Redis) is renewed from here on, by this process.
  if (keeper) keeper->resume_in_child();
  if (journal) journal->owner = ::getpid();  // this holder writes the journal's end now

  lease.set_holder(::getpid(), "detached", watched_pid, owners.session_id());
  const pid_t self = ::getpid();  // "ready": the holder's pid
  [[maybe_unused]] const ssize_t n = ::write(ready_fd, &self, sizeof self);
  ::close(ready_fd);

  // A lost Redis lease (not renewable for its TTL, or released elsewhere) has nothing left to
  // hold: the holder ends, so that `gpulock status` no longer shows it.
  const int lost = ::eventfd(0, EFD_CLOEXEC);
  lease.on_lost([lost](const std::string&) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(lost, &one, sizeof one);
  });
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{signals, POLLIN, 0}, {lost, POLLIN, 0}});
    for (const int fd : owners.descriptors()) fds.push_back({fd, POLLIN, 0});
    const bool fallback = fds.size() == 2;  // no pidfds (Linux < 5.3): look every so often
    const int ready_count =
        ::poll(fds.data(), fds.size(),
               fallback ? static_cast<int>(OwnerWatch::kFallbackPoll.count()) : -1);
    if (ready_count < 0 && errno != EINTR) break;
    if (ready_count > 0 && (fds[0].revents != 0 || fds[1].revents != 0)) break;
    if ((ready_count > 0 || fallback) && owners.gone()) break;
  }
  // Releasing closes the lock descriptors (the kernel releases the GPUs) or ends the Redis lease.
  lease.release();
  ::_exit(0);
}

}  // namespace

// Hands the lease to a holder process; a friend of Lease, for its keeper and journal.
class DetachedHolder {
 public:
  static pid_t start(Lease& lease, OwnerWatch owners, pid_t watched_pid);
};

pid_t DetachedHolder::start(Lease& lease, OwnerWatch owners, pid_t watched_pid) {
  // No thread may hold a lock across fork: the keeper's renewals stop until the holder resumes.
  LeaseKeeper* keeper = lease.state_ ? lease.state_->keeper.get() : nullptr;
  if (keeper) keeper->prepare_fork();
  LeaseJournalDebt* journal = lease.state_ ? &lease.state_->journal : nullptr;
  int ready_pipe[2];
  if (::pipe2(ready_pipe, O_CLOEXEC) != 0)
    throw Error(ErrorCode::kInternal, errno_message("pipe2", errno));
  UniqueFd ready_read(ready_pipe[0]), ready_write(ready_pipe[1]);

  // The holder runs on after fork, allocating: no helper thread may be in the middle of
  // anything (util/helper_threads.h). They end within milliseconds; past that, fork anyway.
  wait_for_helper_threads(std::chrono::seconds(2));
  const pid_t middle = ::fork();
  if (middle < 0) throw Error(ErrorCode::kInternal, errno_message("fork", errno));
  if (middle == 0) {
    ::setsid();
    const pid_t holder = ::fork();
    if (holder == 0)
      hold_until_done(lease, keeper, journal, owners, watched_pid, ready_write.get());
    ::_exit(holder < 0 ? 1 : 0);
  }
  ready_write.reset();
  int status = 0;
  while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
  }

  pid_t holder = 0;
  ssize_t got;
  do {
    got = ::read(ready_read.get(), &holder, sizeof holder);
  } while (got < 0 && errno == EINTR);
  if (got != static_cast<ssize_t>(sizeof holder) || holder <= 0) {
    if (keeper) keeper->resume_in_child();  // still ours: renew it again (a fresh connection)
    throw Error(ErrorCode::kInternal, "the detached lease holder failed to start");
  }
  if (keeper) keeper->disown();     // the holder renews and releases it now
  if (journal) journal->owner = 0;  // and writes the journal's end record
  // The caller's own copies of the descriptors go with its Lease; the holder keeps the GPUs.
  return holder;
}

pid_t detach_lease(Lease& lease, pid_t watched_pid) {
  return DetachedHolder::start(lease, OwnerWatch::process(watched_pid), watched_pid);
}

std::vector<std::string> check_detached_owner(pid_t pid) {
  if (pid == ::getpid())
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--for-pid {} is this gpulock process itself ($BASHPID inside $(…) "
                            "or <(…) names the process that runs gpulock): the lease would end "
                            "as soon as it is taken. Leave out --for-pid to hold the lease for "
                            "this session, or take the pid outside: me=$BASHPID; … --for-pid $me",
                            pid));
  if (pid <= 0 || !process_id_of(pid))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--for-pid {}: no such running process", pid));
  std::vector<std::string> warnings;
  if (writes_to_pipe_of(pid, STDOUT_FILENO))
    warnings.push_back(fmt::format(
        "--for-pid {} writes to the same pipe as gpulock's output: it is a subshell of the same "
        "$(…) or <(…), which ends once that output is read, and the lease ends with it. Leave "
        "out --for-pid to hold the lease for this session until `gpulock release`",
        pid));
  return warnings;
}

bool is_ancestor_of_caller(pid_t pid) {
  const auto id = process_id_of(pid);
  return id && pid != ::getpid() && is_same_or_descendant(::getpid(), *id);
}

pid_t detach_lease_for_session(Lease& lease) {
  const pid_t session = ::getsid(0);
  if (session < 0) throw Error(ErrorCode::kInternal, errno_message("getsid", errno));
  return DetachedHolder::start(lease, OwnerWatch::session(session, {::getpid()}), 0);
}

}  // namespace gpulock
