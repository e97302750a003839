// A write to a pipe or FIFO that never raises SIGPIPE (util/quiet_pipe_write.h).
#include "util/quiet_pipe_write.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace gpulock {

ssize_t quiet_pipe_write(int fd, const void* data, std::size_t size) {
  sigset_t pipe_only, previous;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  if (::pthread_sigmask(SIG_BLOCK, &pipe_only, &previous) != 0) return ::write(fd, data, size);
  // A SIGPIPE pending before is someone else's: it is left pending.
  sigset_t pending;
  sigpending(&pending);
  const bool pending_before = sigismember(&pending, SIGPIPE) == 1;
  const ssize_t written = ::write(fd, data, size);
  const int saved = errno;
  if (written < 0 && saved == EPIPE && !pending_before) {
    const timespec now{0, 0};
    while (::sigtimedwait(&pipe_only, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  errno = saved;
  return written;
}

}  // namespace gpulock
