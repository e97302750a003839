// Closing descriptors off the caller's path (src/util/close_in_background.h): each is closed,
// none is left to a child forked before its closer ran, and a full table closes in place.
#include "util/close_in_background.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "inotify_instances.h"

namespace gpulock {
namespace {

using test_support::InotifyInstances;
using test_support::InotifyInstancesFallTo;
using Clock = std::chrono::steady_clock;

bool IsOpen(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

// Whether every pending close is done within 30 s (a close of an inotify instance waits for a
// kernel grace period).
bool NoClosePendingSoon() {
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (background_closes_pending() > 0) {
    if (Clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The exit status of a child that ran `body` (its return value), or -1.
template <typename Body>
int RunInChild(Body body) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(body());
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(CloseInBackgroundTest, AnInotifyInstanceIsClosedAndNotListedAfterwards) {
  ASSERT_TRUE(InotifyInstancesFallTo(0));
  UniqueFd instance(::inotify_init1(IN_CLOEXEC));
  if (!instance) GTEST_SKIP() << "no inotify instance left for this user";
  close_in_background(std::move(instance));
  EXPECT_TRUE(InotifyInstancesFallTo(0));
  EXPECT_TRUE(NoClosePendingSoon());
}

TEST(CloseInBackgroundTest, AChildForkedWhileACloseIsPendingDoesNotKeepTheInstance) {
  ASSERT_TRUE(InotifyInstancesFallTo(0));
  UniqueFd instance(::inotify_init1(IN_CLOEXEC));
  if (!instance) GTEST_SKIP() << "no inotify instance left for this user";
  int held_by_child = -1;
  {
    const BackgroundClosesPausedForTest paused;
    close_in_background(std::move(instance));
    ASSERT_EQ(background_closes_pending(), 1);
    // Python multiprocessing forks like this, with no exec to close the copy.
    held_by_child = RunInChild([] { return InotifyInstances(); });
  }
  EXPECT_EQ(held_by_child, 0);
  EXPECT_TRUE(InotifyInstancesFallTo(0));
}

TEST(CloseInBackgroundTest, AChildForkedWhileACloserRunsClosesInPlace) {
  const BackgroundClosesPausedForTest paused;  // a closer the child started would wait too
  const int running = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(running, 0);
  close_in_background(UniqueFd(running));
  ASSERT_EQ(background_closes_pending(), 1) << "no closer thread could be started";
  const int status = RunInChild([] {
    const int fd = ::eventfd(0, EFD_CLOEXEC);
    if (fd < 0) return 2;
    close_in_background(UniqueFd(fd));
    return IsOpen(fd) ? 1 : 0;
  });
  EXPECT_EQ(status, 0) << "the child left its descriptor to a thread, or could not make one";
}

TEST(CloseInBackgroundTest, WithEverySlotTakenTheNextDescriptorClosesAtOnce) {
  ASSERT_TRUE(NoClosePendingSoon());
  std::vector<int> listed;
  {
    const BackgroundClosesPausedForTest paused;
    for (int i = 0; i < kMaxBackgroundCloses; ++i) {
      const int fd = ::eventfd(0, EFD_CLOEXEC);
      ASSERT_GE(fd, 0);
      listed.push_back(fd);
      close_in_background(UniqueFd(fd));
    }
    ASSERT_EQ(background_closes_pending(), kMaxBackgroundCloses);
    const int one_more = ::eventfd(0, EFD_CLOEXEC);
    ASSERT_GE(one_more, 0);
    close_in_background(UniqueFd(one_more));
    EXPECT_FALSE(IsOpen(one_more));
    for (const int fd : listed) EXPECT_TRUE(IsOpen(fd)) << fd;
  }
  // A closer empties its slot just before it closes.
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  for (const int fd : listed) {
    while (IsOpen(fd) && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_FALSE(IsOpen(fd)) << fd;
  }
}

}  // namespace
}  // namespace gpulock
