// quiet_pipe_write (src/util/quiet_pipe_write.h): a write into a pipe whose reader is gone fails
// with EPIPE and does not kill the process, whose SIGPIPE handling is left as it was.
#include "util/quiet_pipe_write.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace gpulock {
namespace {

// Runs `body` in a child with SIGPIPE at its default (death); returns its wait status.
template <typename Body>
int InChildWithDefaultSigpipe(Body body) {
  const pid_t child = ::fork();
  if (child == 0) {
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

TEST(QuietPipeWrite, WriteWithoutReaderFailsWithEpipeInsteadOfKilling) {
  const int status = InChildWithDefaultSigpipe([] {
    int fds[2];
    if (::pipe(fds) != 0) return 10;
    ::close(fds[0]);
    const char byte = 'w';
    if (quiet_pipe_write(fds[1], &byte, 1) != -1 || errno != EPIPE) return 11;
    // Nothing is left pending, and SIGPIPE is unblocked again as it was.
    sigset_t pending, mask;
    sigpending(&pending);
    ::sigprocmask(SIG_SETMASK, nullptr, &mask);
    if (sigismember(&pending, SIGPIPE) || sigismember(&mask, SIGPIPE)) return 12;
    return 0;
  });
  // A plain write(2) here kills the child with SIGPIPE.
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(QuietPipeWrite, WriteWithReaderDelivers) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const char byte = 'w';
  EXPECT_EQ(quiet_pipe_write(fds[1], &byte, 1), 1);
  char got = 0;
  EXPECT_EQ(::read(fds[0], &got, 1), 1);
  EXPECT_EQ(got, 'w');
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(QuietPipeWrite, ASigpipePendingBeforeIsLeftPending) {
  const int status = InChildWithDefaultSigpipe([] {
    sigset_t pipe_only, pending;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    ::sigprocmask(SIG_BLOCK, &pipe_only, nullptr);
    ::raise(SIGPIPE);
    int fds[2];
    if (::pipe(fds) != 0) return 10;
    ::close(fds[0]);
    const char byte = 'w';
    if (quiet_pipe_write(fds[1], &byte, 1) != -1) return 11;
    sigpending(&pending);
    return sigismember(&pending, SIGPIPE) == 1 ? 0 : 12;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace gpulock
