// AcquireMutex (src/local/acquire_mutex.h): a process that finds the machine-wide acquire
// mutex held queues a blocking request in the kernel (seen in /proc/locks) and is let in when
// the holder lets go, however it lets go; it times out on a holder that never does, or stops
// when interrupted, without keeping the lock once the kernel grants its abandoned request; the
// same pool asking again takes that request over; a forked child does not wait on its parent's.
// Two AcquireMutex objects on one directory stand for two processes (their OFD locks conflict
// within one process too).
#include "local/acquire_mutex.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "gpulock/error.hpp"
#include "local/gpu_lock_file.h"
#include "temp_dir.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = AcquireMutex::Clock;

class AcquireMutexTest : public ::testing::Test {
 protected:
  test_support::TempDir temp_;
  fs::path path_ = temp_.path() / "locks";
  LockDirectory dir_ = LockDirectory::open(path_);

  // How many blocked requests the kernel has queued on the mutex's file (/proc/locks lists a
  // blocked request as "N: -> OFDLCK ADVISORY WRITE pid maj:min:inode start end").
  int QueuedInTheKernel() {
    struct stat st {};
    if (::stat((path_ / LockDirectory::kAcquireMutexName).c_str(), &st) != 0) return 0;
    const std::string inode = ":" + std::to_string(st.st_ino) + " ";
    std::ifstream locks("/proc/locks");
    int queued = 0;
    for (std::string line; std::getline(locks, line);)
      if (line.find("->") != std::string::npos && line.find(inode) != std::string::npos) ++queued;
    return queued;
  }

  // Waits (generously) until `n` requests are queued in the kernel.
  bool WaitForQueued(int n) {
    const auto until = Clock::now() + 30s;
    while (QueuedInTheKernel() < n) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  // True once nobody holds the mutex: a descriptor of our own gets it (within a generous limit).
  bool FreeSoon() {
    UniqueFd probe = dir_.open_acquire_mutex();
    const auto until = Clock::now() + 30s;
    while (!try_lock_exclusive(probe.get())) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  // A descriptor of our own holding the mutex's lock, as another process (or version) would.
  UniqueFd ForeignHolder() {
    UniqueFd foreign = dir_.open_acquire_mutex();
    EXPECT_TRUE(try_lock_exclusive(foreign.get()));
    return foreign;
  }
};

TEST_F(AcquireMutexTest, AWaiterQueuesInTheKernelAndIsLetInWhenTheHolderLetsGo) {
  AcquireMutex holder(dir_);
  AcquireMutex waiter(dir_);
  std::optional<AcquireMutex::Hold> held;
  held.emplace(holder.hold(Clock::now() + 10s));
  std::future<void> got_in = std::async(
      std::launch::async, [&] { AcquireMutex::Hold hold = waiter.hold(Clock::now() + 60s); });
  ASSERT_TRUE(WaitForQueued(1)) << "the waiter did not queue a blocking request";
  EXPECT_EQ(got_in.wait_for(0s), std::future_status::timeout) << "the mutex was not held";
  held.reset();
  ASSERT_EQ(got_in.wait_for(30s), std::future_status::ready);
  got_in.get();
  EXPECT_EQ(QueuedInTheKernel(), 0);
  EXPECT_TRUE(FreeSoon()) << "the waiter kept the mutex after its hold ended";
}

TEST_F(AcquireMutexTest, AHolderThatLetsGoWithoutAWordLetsTheWaiterIn) {
  // As when the holder dies, or is another version: its lock simply goes with the descriptor.
  AcquireMutex waiter(dir_);
  UniqueFd foreign = ForeignHolder();
  std::future<void> got_in = std::async(
      std::launch::async, [&] { AcquireMutex::Hold hold = waiter.hold(Clock::now() + 60s); });
  ASSERT_TRUE(WaitForQueued(1));
  foreign.reset();
  ASSERT_EQ(got_in.wait_for(30s), std::future_status::ready);
  got_in.get();
}

TEST_F(AcquireMutexTest, WaitersAreLetInInTheOrderTheyQueued) {
  AcquireMutex holder(dir_);
  std::optional<AcquireMutex::Hold> held;
  held.emplace(holder.hold(Clock::now() + 10s));
  constexpr int kWaiters = 5;
  std::vector<std::unique_ptr<AcquireMutex>> waiters;
  std::vector<std::thread> threads;
  std::mutex order_mutex;
  std::vector<int> order;
  // All made before any thread starts: the threads read the vector.
  for (int i = 0; i < kWaiters; ++i) waiters.push_back(std::make_unique<AcquireMutex>(dir_));
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      AcquireMutex::Hold hold = waiters[i]->hold(Clock::now() + 60s);
      const std::lock_guard<std::mutex> guard(order_mutex);
      order.push_back(i);
    });
    ASSERT_TRUE(WaitForQueued(i + 1));  // each queued before the next arrives
  }
  held.reset();
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST_F(AcquireMutexTest, AWaiterGivesUpOnAHolderThatNeverLetsGoAndKeepsNothing) {
  AcquireMutex waiter(dir_);
  UniqueFd foreign = ForeignHolder();
  try {
    AcquireMutex::Hold never = waiter.hold(Clock::now() + 200ms);
    ADD_FAILURE() << "got a mutex that was held";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kTimedOut);
    EXPECT_NE(std::string(error.what()).find(".acquire.lock"), std::string::npos) << error.what();
  }
  // Its request stays queued; granted once the holder goes, it is let go at once.
  EXPECT_EQ(QueuedInTheKernel(), 1);
  foreign.reset();
  EXPECT_TRUE(FreeSoon()) << "the abandoned request kept the mutex";
}

TEST_F(AcquireMutexTest, AnInterruptedWaiterStopsAndKeepsNothing) {
  AcquireMutex waiter(dir_);
  UniqueFd foreign = ForeignHolder();
  std::atomic<int> asked{0};
  const std::function<bool()> interrupted = [&] { return ++asked >= 3; };
  try {
    AcquireMutex::Hold never = waiter.hold(Clock::time_point::max(), interrupted, 10ms);
    ADD_FAILURE() << "got a mutex that was held";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInterrupted) << error.what();
  }
  EXPECT_GE(asked.load(), 3);
  foreign.reset();
  EXPECT_TRUE(FreeSoon()) << "the interrupted request kept the mutex";
}

TEST_F(AcquireMutexTest, AskingAgainTakesOverTheRequestLeftQueued) {
  AcquireMutex waiter(dir_);
  UniqueFd foreign = ForeignHolder();
  EXPECT_THROW(waiter.hold(Clock::now() + 100ms), Error);
  ASSERT_EQ(QueuedInTheKernel(), 1);
  std::future<void> got_in = std::async(std::launch::async, [&] {
    AcquireMutex::Hold hold = waiter.hold(Clock::now() + 60s);
    // Its place in the line, not a second one.
    EXPECT_EQ(QueuedInTheKernel(), 0);
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(QueuedInTheKernel(), 1) << "asking again queued a second request";
  foreign.reset();
  ASSERT_EQ(got_in.wait_for(30s), std::future_status::ready);
  got_in.get();
  EXPECT_TRUE(FreeSoon());
}

TEST_F(AcquireMutexTest, AChildForkedWhileARequestIsQueuedWaitsOnItsOwn) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer cannot start threads in a child forked from a process with "
                  "threads (the parent's helper); the ASan and normal builds run this test";
#endif
  AcquireMutex waiter(dir_);
  UniqueFd foreign = ForeignHolder();
  EXPECT_THROW(waiter.hold(Clock::now() + 100ms), Error);  // leaves its request queued
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    foreign.reset();  // the "other process" holding the lock is the parent
    // The parent's helper is not here: this child's pool must make a request of its own.
    try {
      AcquireMutex::Hold hold = waiter.hold(Clock::now() + 30s);
      ::_exit(0);
    } catch (...) {
      ::_exit(1);
    }
  }
  ASSERT_TRUE(WaitForQueued(2)) << "the child did not queue a request of its own";
  foreign.reset();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(FreeSoon());
}

}  // namespace
}  // namespace gpulock
