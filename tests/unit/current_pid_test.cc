// current_pid (src/util/current_pid.h): getpid() read once, and read again in a fork child,
// also in the child of a child and after threads asked before the fork.
#include "util/current_pid.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

namespace gpulock {
namespace {

// The exit status of a child running `body` (0 when it returned true).
template <typename Body>
int ExitOfChild(Body body) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(body() ? 0 : 1);
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(CurrentPid, IsThisProcesssId) {
  EXPECT_EQ(current_pid(), ::getpid());
  pid_t from_thread = 0;
  std::thread([&] { from_thread = current_pid(); }).join();
  EXPECT_EQ(from_thread, ::getpid());
}

TEST(CurrentPid, AForkChildHasItsOwn) {
  const pid_t parent = current_pid();  // kept before the fork
  EXPECT_EQ(ExitOfChild([&] {
              const pid_t mine = current_pid();
              if (mine != ::getpid() || mine == parent) return false;
              // And the child of the child, which inherits the handler.
              return ExitOfChild(
                         [&] { return current_pid() == ::getpid() && current_pid() != mine; }) == 0;
            }),
            0);
  EXPECT_EQ(current_pid(), parent);
}

}  // namespace
}  // namespace gpulock
