// WaitChannel: inotify watches on the lock directory and one ticket, plus the wake FIFO.
#include "local/wait_channel.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>
#include <thread>

#include "gpulock/error.hpp"
#include "local/lock_directory.h"

namespace gpulock {
namespace {

constexpr std::chrono::milliseconds kPollInterval{100};

void drain_fd(int fd) {
  char buffer[256];
  while (fd >= 0 && ::read(fd, buffer, sizeof buffer) > 0) {
  }
}

}  // namespace

WaitChannel::WaitChannel() : inotify_fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  // Without inotify (fs.inotify.max_user_instances reached, e.g. by hundreds of waiting jobs of
  // one user) waiting still works, by polling.
}

bool WaitChannel::watch_directory(int dir_fd, bool on, int& wd) {
  if (!inotify_fd_ || on == (wd >= 0)) return false;
  if (!on) {
    ::inotify_rm_watch(inotify_fd_.get(), wd);
    wd = -1;
    return false;
  }
  // Watch the directory we hold open, not a path that could be swapped under us.
  const std::string path = "/proc/self/fd/" + std::to_string(dir_fd);
  wd = ::inotify_add_watch(inotify_fd_.get(), path.c_str(), IN_CLOSE_WRITE | IN_ONLYDIR);
  if (wd < 0) fall_back_to_polling();
  return true;
}

bool WaitChannel::watch_releases(int lock_dir_fd, bool on) {
  return watch_directory(lock_dir_fd, on, releases_wd_);
}

bool WaitChannel::watch_departures(int queue_dir_fd, bool on) {
  return watch_directory(queue_dir_fd, on, departures_wd_);
}

void WaitChannel::fall_back_to_polling() {
  // Out of watches (fs.inotify.max_user_watches): every wait() then reports "maybe" after at
  // most 100 ms, whatever was being watched.
  inotify_fd_.reset();
  releases_wd_ = departures_wd_ = ticket_wd_ = -1;
  ticket_path_.clear();
}

bool WaitChannel::watch_ticket(const std::string& path) {
  if (!inotify_fd_) return true;
  if (path == ticket_path_ && (ticket_wd_ >= 0 || path.empty())) return true;
  if (ticket_wd_ >= 0) ::inotify_rm_watch(inotify_fd_.get(), ticket_wd_);
  ticket_wd_ = -1;
  ticket_path_.clear();
  if (path.empty()) return true;
  ticket_wd_ = ::inotify_add_watch(inotify_fd_.get(), path.c_str(),
                                   IN_CLOSE_WRITE | IN_DELETE_SELF | IN_DONT_FOLLOW);
  if (ticket_wd_ < 0) {
    if (errno == ENOENT) return false;
    fall_back_to_polling();
    return true;
  }
  ticket_path_ = path;
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
      } else if (event->wd == releases_wd_ && releases_wd_ >= 0) {
        if (event->len > 0 && LockDirectory::is_lock_file_name(event->name)) woke.release = true;
      } else if (event->wd == departures_wd_ && departures_wd_ >= 0) {
        const std::string_view name = event->len > 0 ? event->name : "";
        if (name.ends_with(".ticket")) woke.queue_change = true;
      } else if (event->wd == ticket_wd_ && ticket_wd_ >= 0) {
        woke.queue_change = true;
        if ((event->mask & IN_IGNORED) != 0) {  // the kernel dropped the watch: the file is gone
          ticket_wd_ = -1;
          ticket_path_.clear();
        }
      }
    }
  }
  return woke;
}

WaitChannel::Wakeup WaitChannel::wait(int wake_fd, std::chrono::milliseconds timeout) {
  if (!inotify_fd_) {
    pollfd p{wake_fd, POLLIN, 0};
    const auto pause = std::min(timeout, kPollInterval);
    ::poll(&p, wake_fd >= 0 ? 1 : 0, static_cast<int>(pause.count()));
    drain_fd(wake_fd);
    Wakeup maybe;  // polling: anything may have happened
    maybe.release = maybe.queue_change = timeout >= kPollInterval;
    return maybe;
  }
  Wakeup woke = drain();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (woke.timed_out()) {
    // Rounded up: rounding down would make the last millisecond a busy loop.
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p[2] = {{inotify_fd_.get(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const int ready = ::poll(p, wake_fd >= 0 ? 2 : 1,
                             static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (ready < 0 && errno != EINTR)
      throw Error(ErrorCode::kInternal, errno_message("poll while waiting for GPUs", errno));
    // A signal handler ran (e.g. Python's for Ctrl-C): return early, so that the caller's
    // interrupt check runs now rather than at its next poll.
    if (ready < 0) break;
    if (ready > 0 && (p[1].revents & POLLIN) != 0) woke.queue_change = true;
    if (ready > 0 && (p[0].revents & POLLIN) != 0) {
      const Wakeup events = drain();
      woke.release |= events.release;
      woke.queue_change |= events.queue_change;
    }
  }
  drain_fd(wake_fd);
  return woke;
}

void WaitChannel::reset() {
  if (inotify_fd_) {
    if (releases_wd_ >= 0) ::inotify_rm_watch(inotify_fd_.get(), releases_wd_);
    if (departures_wd_ >= 0) ::inotify_rm_watch(inotify_fd_.get(), departures_wd_);
    if (ticket_wd_ >= 0) ::inotify_rm_watch(inotify_fd_.get(), ticket_wd_);
    drain();
  } else {
    inotify_fd_.reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));  // try inotify again
  }
  releases_wd_ = departures_wd_ = ticket_wd_ = -1;
  ticket_path_.clear();
}

}  // namespace gpulock
