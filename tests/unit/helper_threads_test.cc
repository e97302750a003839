// The list of gpulock's helper threads (src/util/helper_threads.h): a fork without exec waits
// until every helper is gone from /proc/self/task, except those blocked in a kernel wait, and a
// forked child lists none of its parent's.
#include "util/helper_threads.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace gpulock {
namespace {

bool ThreadListed(int tid) {
  struct stat st {};
  return ::stat(("/proc/self/task/" + std::to_string(tid)).c_str(), &st) == 0;
}

TEST(HelperThreadsTest, AWaitEndsOnlyOnceTheHelperIsGoneFromTheProcess) {
  ASSERT_TRUE(wait_for_helper_threads(std::chrono::seconds(30)));
  const int others = helper_threads_listed();  // blocked ones other tests left
  const int slot = reserve_helper_thread();
  ASSERT_GE(slot, 0);
  std::atomic<bool> go{false};
  std::atomic<int> tid{0};
  std::thread helper([&] {
    helper_thread_started(slot);
    tid = static_cast<int>(::syscall(SYS_gettid));
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  helper.detach();
  EXPECT_EQ(helper_threads_listed(), others + 1);
  // Reserved but not yet started counts too: no fork may slip in before the thread's first step.
  EXPECT_FALSE(wait_for_helper_threads(std::chrono::milliseconds(50)));
  go = true;
  ASSERT_TRUE(wait_for_helper_threads(std::chrono::seconds(30)));
  ASSERT_NE(tid.load(), 0);
  EXPECT_FALSE(ThreadListed(tid)) << "the wait ended while the thread still existed";
  EXPECT_EQ(helper_threads_listed(), others);
}

TEST(HelperThreadsTest, AHelperBlockedInTheKernelIsNotWaitedFor) {
  const int slot = reserve_helper_thread();
  ASSERT_GE(slot, 0);
  std::atomic<int> stage{0};
  std::thread helper([&] {
    helper_thread_started(slot);
    {
      const HelperThreadBlocked blocked(slot);
      stage = 1;
      while (stage == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    while (stage == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (stage != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(wait_for_helper_threads(std::chrono::milliseconds(0)));
  stage = 2;  // out of the kernel wait, running again: waited for
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(wait_for_helper_threads(std::chrono::milliseconds(20)));
  stage = 3;
  helper.join();
  EXPECT_TRUE(wait_for_helper_threads(std::chrono::seconds(30)));
}

TEST(HelperThreadsTest, AForkedChildListsNoneOfItsParentsHelpers) {
  ASSERT_TRUE(wait_for_helper_threads(std::chrono::seconds(30)));
  const int others = helper_threads_listed();
  const int slot = reserve_helper_thread();
  ASSERT_GE(slot, 0);
  std::atomic<bool> go{false};
  std::thread helper([&] {
    helper_thread_started(slot);
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const pid_t child = ::fork();
  if (child == 0)
    ::_exit(helper_threads_listed() == 0 && wait_for_helper_threads(std::chrono::seconds(0)) ? 0
                                                                                             : 1);
  int status = -1;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(helper_threads_listed(), others + 1);
  go = true;
  helper.join();
  EXPECT_TRUE(wait_for_helper_threads(std::chrono::seconds(30)));
}

}  // namespace
}  // namespace gpulock
