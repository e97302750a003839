// WaitChannel: inotify watches on the lock and queue directories (dispatchers only), a pidfd
// on the waiter before this one, and the wake FIFO.
#include "local/wait_channel.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>

#include "gpulock/error.hpp"
#include "local/fork_guard.h"
#include "local/lock_directory.h"
#include "process/process_identity.h"
#include "util/close_in_background.h"
#include "util/current_pid.h"
#include "util/fork_gate.h"

namespace gpulock {
namespace {

constexpr std::chrono::milliseconds kPollInterval{100};

// Empties the wake FIFO, noting what its bytes asked: byte 2 only says "you are a dispatcher
// now", byte 3 "you are the oldest waiter now" (QueueDirectory's WakeReason); any other byte
// asks for a plan.
void drain_wakeups(int fd, WaitChannel::Wakeup& woke) {
  char buffer[256];
  ssize_t n = 0;
  while (fd >= 0 && (n = ::read(fd, buffer, sizeof buffer)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] == 2) {
        woke.promoted = true;
      } else if (buffer[i] == 3) {
        woke.promoted = woke.made_oldest = true;
      } else {
        woke.woken = true;
      }
      woke.queue_change = true;
    }
  }
}

}  // namespace

WaitChannel::WaitChannel() = default;

WaitChannel::~WaitChannel() {
  give_back_inotify_instance();
}

bool WaitChannel::drop_inherited_inotify_instance() {
  if (!inotify_fd_ || current_pid() == inotify_owner_) return false;
  // A forked child's copy: fork closed it (fork_guard.h), and its number may be another file's
  // by now.
  inotify_fd_.release();
  return true;
}

void WaitChannel::give_back_inotify_instance() {
  if (!inotify_fd_ || drop_inherited_inotify_instance()) return;
  close_in_background(std::move(inotify_fd_), forget_in_forked_child);
}

bool WaitChannel::watch_releases(int lock_dir_fd, bool on) {
  if (polling_ || on == (releases_wd_ >= 0)) return false;
  if (!on) {
    if (inotify_fd_) ::inotify_rm_watch(inotify_fd_.get(), releases_wd_);
    releases_wd_ = -1;
    return false;
  }
  drop_inherited_inotify_instance();
  if (!inotify_fd_) {
    // A child forked without exec (by another thread: Python multiprocessing) would otherwise
    // hold this instance, against its user's limit, for as long as it lives: it is guarded in
    // the same step as it is made.
    const ForkGate gate;
    inotify_fd_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (!inotify_fd_) {
      // fs.inotify.max_user_instances reached: this dispatcher polls instead.
      fall_back_to_polling();
      return true;
    }
    inotify_owner_ = current_pid();
    close_in_forked_child(inotify_fd_.get());
  }
  // Watch the directory we hold open, not a path that could be swapped under us.
  const std::string path = "/proc/self/fd/" + std::to_string(lock_dir_fd);
  releases_wd_ = ::inotify_add_watch(inotify_fd_.get(), path.c_str(), IN_CLOSE_WRITE | IN_ONLYDIR);
  if (releases_wd_ < 0) fall_back_to_polling();
  return true;
}

void WaitChannel::fall_back_to_polling() {
  // Out of inotify instances or watches: every wait() then reports "maybe" after at most
  // 100 ms, whatever was being watched.
  give_back_inotify_instance();
  polling_ = true;
  releases_wd_ = -1;
}

bool WaitChannel::watch_process(const ProcessId& process) {
  if (process.pid == watched_pid_ && (process.pid == 0 || process_fd_)) return true;
  process_fd_.reset();
  watched_pid_ = 0;
  if (process.pid <= 0) return true;
  process_fd_.reset(open_pidfd(process.pid));
  if (!process_fd_) return errno != ESRCH;  // gone already; without pidfds, watch nothing
  ::fcntl(process_fd_.get(), F_SETFD, FD_CLOEXEC);
  // Opened first, then checked: a pid reused by another process is not the waiter.
  if (!is_alive(process)) {
    process_fd_.reset();
    return false;
  }
  watched_pid_ = process.pid;
  return true;
}

WaitChannel::Wakeup WaitChannel::drain() {
  Wakeup woke;
  if (!inotify_fd_) return woke;
  alignas(inotify_event) char buffer[4096];
  while (true) {
    const ssize_t n = ::read(inotify_fd_.get(), buffer, sizeof buffer);
    if (n <= 0) break;
    for (ssize_t offset = 0; offset < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
      offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      if ((event->mask & IN_Q_OVERFLOW) != 0) {
        woke.release = woke.queue_change = true;  // events were lost: look at everything
      } else if (event->wd == releases_wd_ && releases_wd_ >= 0 && event->len > 0) {
        const std::string_view name = event->name;
        if (name == LockDirectory::kDeparturesName) {
          woke.queue_change = true;
        } else if (LockDirectory::is_lock_file_name(event->name)) {
          woke.release = true;
        }
      }
    }
  }
  return woke;
}

WaitChannel::Wakeup WaitChannel::wait(int wake_fd, std::chrono::milliseconds timeout,
                                      int interrupt_fd) {
  Wakeup woke = drain();
  const bool polling = polling_;
  const auto deadline =
      std::chrono::steady_clock::now() + (polling ? std::min(timeout, kPollInterval) : timeout);
  // Once at least, without sleeping when something is known already, so that every source
  // ready now is reported together.
  for (bool first = true; first || woke.timed_out(); first = false) {
    // Rounded up: rounding down would make the last millisecond a busy loop.
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (!woke.timed_out()) left = std::chrono::milliseconds(0);
    if (left.count() < 0 || (left.count() == 0 && !first)) break;
    constexpr nfds_t kNone = 4;
    pollfd p[kNone];
    nfds_t count = 0;
    const auto add = [&](int fd) {
      p[count] = pollfd{fd, POLLIN, 0};
      return fd >= 0 ? count++ : kNone;
    };
    const nfds_t inotify_at = add(inotify_fd_.get());
    const nfds_t wake_at = add(wake_fd);
    const nfds_t process_at = add(process_fd_.get());
    const nfds_t interrupt_at = add(interrupt_fd);
    const int ready =
        ::poll(p, count, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (ready < 0 && errno != EINTR)
      throw Error(ErrorCode::kInternal, errno_message("poll while waiting for GPUs", errno));
    // A signal handler ran (e.g. Python's for Ctrl-C): return early, so that the caller's
    // interrupt check runs now rather than at its next poll.
    if (ready < 0) break;
    if (ready == 0) continue;  // (ends the loop if something is known already)
    if (wake_at < kNone && (p[wake_at].revents & POLLIN) != 0) drain_wakeups(wake_fd, woke);
    if (process_at < kNone && p[process_at].revents != 0) {
      // The watched waiter ended: its descriptor stays readable, so stop watching it.
      woke.queue_change = woke.watched_ended = true;
      process_fd_.reset();
      watched_pid_ = 0;
    }
    if (inotify_at < kNone && (p[inotify_at].revents & POLLIN) != 0) {
      const Wakeup events = drain();
      woke.release |= events.release;
      woke.queue_change |= events.queue_change;
    }
    // As for a signal: the caller's interrupt check runs now.
    if (interrupt_at < kNone && p[interrupt_at].revents != 0) break;
  }
  drain_wakeups(wake_fd, woke);
  if (polling && woke.timed_out() && timeout >= kPollInterval)
    woke.release = woke.queue_change = woke.woken = true;  // polling: anything may have happened
  return woke;
}

}  // namespace gpulock
