// inotify-based release notification.
#include "local/release_watcher.h"

#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

#include "gpulock/error.hpp"
#include "local/lock_directory.h"

namespace gpulock {
namespace {

constexpr std::chrono::milliseconds kPollInterval{100};

}  // namespace

ReleaseWatcher::ReleaseWatcher(int dir_fd)
    : inotify_fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
  // Watch the directory we hold open, not a path that could be swapped under us.
  const std::string path = "/proc/self/fd/" + std::to_string(dir_fd);
  if (inotify_fd_ &&
      ::inotify_add_watch(inotify_fd_.get(), path.c_str(), IN_CLOSE_WRITE | IN_ONLYDIR) < 0)
    inotify_fd_.reset();
  // Without inotify (the per-user limits fs.inotify.max_user_instances / max_user_watches are
  // reached, e.g. by a sweep of hundreds of waiting jobs) waiting still works, by polling.
}

bool ReleaseWatcher::drain() {
  if (!inotify_fd_) return false;
  alignas(inotify_event) char buffer[4096];
  bool relevant = false;
  while (true) {
    const ssize_t n = ::read(inotify_fd_.get(), buffer, sizeof buffer);
    if (n <= 0) break;
    for (ssize_t offset = 0; offset < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + offset);
      // An overflow means events were lost: treat it as a release so the caller re-checks.
      if ((event->mask & IN_Q_OVERFLOW) != 0) relevant = true;
      if (event->len > 0 && LockDirectory::is_lock_file_name(event->name)) relevant = true;
      offset += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
  return relevant;
}

bool ReleaseWatcher::wait(std::chrono::milliseconds timeout) {
  if (!inotify_fd_) {
    std::this_thread::sleep_for(std::min(timeout, kPollInterval));
    return timeout >= kPollInterval;  // "maybe": the caller re-checks
  }
  if (drain()) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{inotify_fd_.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (ready < 0 && errno != EINTR)
      throw Error(ErrorCode::kInternal, errno_message("poll on inotify", errno));
    if (ready > 0 && drain()) return true;
  }
}

}  // namespace gpulock
