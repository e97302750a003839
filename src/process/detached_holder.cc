// detach_lease(): a daemon-like holder that keeps a lease until a watched process exits.
//
// The holder is a grandchild in its own session, with stdin/stdout/stderr on /dev/null (so
// `eval "$(gpulock acquire …)"` is not kept waiting) and every descriptor but the lease's closed.
// It sleeps in poll() on a pidfd of the watched process and a signalfd for SIGTERM/SIGINT/SIGHUP,
// so it costs nothing while it waits and wakes at once when either happens.
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
#include "process/process_identity.h"
#include "util/fd.h"

namespace gpulock {
namespace {

constexpr int kFallbackPollMs = 1000;  // only where pidfd_open is unavailable (Linux < 5.3)

void close_all_except(const std::set<int>& keep) {
  const long limit = std::min<long>(::sysconf(_SC_OPEN_MAX), 65536);
  for (int fd = 3; fd < limit; ++fd)
    if (!keep.contains(fd)) ::close(fd);
}

[[noreturn]] void hold_until_done(Lease& lease, LeaseKeeper* keeper, LeaseJournalDebt* journal,
                                  const ProcessId& watched, int pidfd, int ready_fd) {
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
  keep.insert({pidfd, ready_fd, signals});
  close_all_except(keep);
  if (journal && journal->journal) journal->journal->forget_descriptors();
  // A lease that is renewed (Redis) is renewed from here on, by this process.
  if (keeper) keeper->resume_in_child();
  if (journal) journal->owner = ::getpid();  // this holder writes the journal's end now

  lease.set_holder(::getpid(), "detached", watched.pid);
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
  while (true) {
    pollfd fds[3] = {{signals, POLLIN, 0}, {lost, POLLIN, 0}, {pidfd, POLLIN, 0}};
    const int count = pidfd >= 0 ? 3 : 2;
    const int ready_count = ::poll(fds, count, pidfd >= 0 ? -1 : kFallbackPollMs);
    if (ready_count < 0 && errno != EINTR) break;
    if (ready_count > 0 &&
        (fds[0].revents != 0 || fds[1].revents != 0 || (count == 3 && fds[2].revents != 0)))
      break;
    if (pidfd < 0 && !is_alive(watched)) break;
  }
  // Releasing closes the lock descriptors (the kernel releases the GPUs) or ends the Redis lease.
  lease.release();
  ::_exit(0);
}

}  // namespace

pid_t detach_lease(Lease& lease, pid_t watched_pid) {
  const auto watched = process_id_of(watched_pid);
  if (watched_pid <= 0 || !watched)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--for-pid {}: no such running process", watched_pid));
  UniqueFd pidfd(open_pidfd(watched_pid));
  // A pidfd refers to the process itself: check it is still the one we identified.
  if (!is_alive(*watched))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--for-pid {}: the process exited", watched_pid));

  // No thread may hold a lock across fork: the keeper's renewals stop until the holder resumes.
  LeaseKeeper* keeper = lease.state_ ? lease.state_->keeper.get() : nullptr;
  if (keeper) keeper->prepare_fork();
  LeaseJournalDebt* journal = lease.state_ ? &lease.state_->journal : nullptr;
  int ready_pipe[2];
  if (::pipe2(ready_pipe, O_CLOEXEC) != 0)
    throw Error(ErrorCode::kInternal, errno_message("pipe2", errno));
  UniqueFd ready_read(ready_pipe[0]), ready_write(ready_pipe[1]);

  const pid_t middle = ::fork();
  if (middle < 0) throw Error(ErrorCode::kInternal, errno_message("fork", errno));
  if (middle == 0) {
    ::setsid();
    const pid_t holder = ::fork();
    if (holder == 0)
      hold_until_done(lease, keeper, journal, *watched, pidfd.get(), ready_write.get());
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

}  // namespace gpulock
