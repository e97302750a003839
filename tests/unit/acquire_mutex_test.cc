// AcquireMutex (src/local/acquire_mutex.h): a process waiting for the machine-wide acquire
// mutex sleeps on its wake FIFO and is let in when the holder lets go; without a usable FIFO it
// polls; it times out on a holder that never lets go. Two AcquireMutex objects on one directory
// stand for two processes (their OFD locks conflict within one process too).
#include "local/acquire_mutex.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "gpulock/error.hpp"
#include "temp_dir.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = AcquireMutex::Clock;

// Longer than any test runs: a waiter that depends on it to get in hangs the test.
constexpr auto kNeverAgain = std::chrono::minutes(10);

class AcquireMutexTest : public ::testing::Test {
 protected:
  test_support::TempDir temp_;
  fs::path path_ = temp_.path() / "locks";
  LockDirectory dir_ = LockDirectory::open(path_);

  // Holds the mutex through `holder` until the returned waiter, started on its own thread with
  // `waiter` (never retrying by itself), has had time to fail once and sleep; then lets go.
  // True if the waiter got the mutex within a generous limit.
  bool WaiterGetsInAfterRelease(AcquireMutex& holder, AcquireMutex& waiter) {
    std::optional<AcquireMutex::Hold> held;
    held.emplace(holder.hold(Clock::now() + 10s));
    std::promise<void> in;
    std::future<void> got_in = in.get_future();
    std::thread thread([&] {
      try {
        AcquireMutex::Hold hold = waiter.hold(Clock::now() + 60s);
        in.set_value();
      } catch (...) {
        in.set_exception(std::current_exception());
      }
    });
    // A machine too slow to start the thread and fail once in this time makes the test pass
    // without testing the wake-up, never fail wrongly.
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(got_in.wait_for(0s), std::future_status::timeout) << "the mutex was not held";
    held.reset();  // lets go
    const bool in_time = got_in.wait_for(30s) == std::future_status::ready;
    if (!in_time) {
      // Unblock the waiter (a byte on the FIFO) so that the thread can be joined.
      AcquireMutex kick(dir_);
      kick.hold(Clock::now() + 10s).release();
    }
    thread.join();
    if (in_time) got_in.get();  // rethrows what the waiter threw
    return in_time;
  }
};

TEST_F(AcquireMutexTest, AWaiterSleepingOnTheFifoIsLetInWhenTheHolderLetsGo) {
  AcquireMutex holder(dir_);
  AcquireMutex waiter(dir_, kNeverAgain);  // only the holder's byte can let it in
  EXPECT_TRUE(WaiterGetsInAfterRelease(holder, waiter));
  struct stat st {};
  ASSERT_EQ(::lstat((path_ / ".acquire.wake").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0666u);
}

TEST_F(AcquireMutexTest, AHolderThatLetsGoWithoutAWordIsNoticedAfterTheSafetyInterval) {
  // As when the holder dies, or is a version before the FIFO: its lock simply goes.
  AcquireMutex waiter(dir_, 20ms);
  UniqueFd foreign = dir_.open_acquire_mutex();
  ASSERT_TRUE(foreign.valid());
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(foreign.get(), F_OFD_SETLK, &lock), 0);
  std::future<void> got_in = std::async(
      std::launch::async, [&] { AcquireMutex::Hold hold = waiter.hold(Clock::now() + 60s); });
  std::this_thread::sleep_for(100ms);
  foreign.reset();  // the lock goes with the descriptor, and nobody writes to the FIFO
  ASSERT_EQ(got_in.wait_for(30s), std::future_status::ready);
  got_in.get();
}

TEST_F(AcquireMutexTest, WithAPlantedFileInsteadOfTheFifoWaitersPoll) {
  {
    UniqueFd planted(::openat(dir_.fd(), ".acquire.wake", O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    ASSERT_TRUE(planted.valid());
  }
  AcquireMutex holder(dir_);
  AcquireMutex waiter(dir_, kNeverAgain);  // polls regardless: it has no FIFO to sleep on
  EXPECT_TRUE(WaiterGetsInAfterRelease(holder, waiter));
  struct stat st {};
  ASSERT_EQ(::lstat((path_ / ".acquire.wake").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the planted file was replaced";
  EXPECT_EQ(st.st_size, 0) << "the planted file was written to";
}

// How many of this process's descriptors are open on the lock directory's wake FIFO.
int DescriptorsOnTheWakeFifo(const fs::path& lock_dir) {
  const fs::path fifo = fs::canonical(lock_dir) / ".acquire.wake";
  int count = 0;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    if (fs::read_symlink(entry.path(), error) == fifo) ++count;
  }
  return count;
}

TEST_F(AcquireMutexTest, AFifoUnusableAtFirstIsUsedOnceItIsUsableAgain) {
  // A planted file under the FIFO's name when the process first takes the mutex; then root
  // removes it and the next user makes the FIFO. The process must not poll for good: it tries
  // the FIFO again after about a second.
  {
    UniqueFd planted(::openat(dir_.fd(), ".acquire.wake", O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    ASSERT_TRUE(planted.valid());
  }
  AcquireMutex late(dir_);
  late.hold(Clock::now() + 10s).release();
  ASSERT_EQ(DescriptorsOnTheWakeFifo(path_), 0);
  ASSERT_EQ(::unlinkat(dir_.fd(), ".acquire.wake", 0), 0);
  AcquireMutex maker(dir_);
  maker.hold(Clock::now() + 10s).release();
  ASSERT_EQ(DescriptorsOnTheWakeFifo(path_), 1) << "the next user did not make the FIFO";
  std::this_thread::sleep_for(1200ms);  // past the retry interval
  late.hold(Clock::now() + 10s).release();
  EXPECT_EQ(DescriptorsOnTheWakeFifo(path_), 2) << "the FIFO was not tried again";
}

TEST_F(AcquireMutexTest, AWaiterGivesUpOnAHolderThatNeverLetsGo) {
  AcquireMutex holder(dir_);
  AcquireMutex waiter(dir_);
  AcquireMutex::Hold held = holder.hold(Clock::now() + 10s);
  try {
    AcquireMutex::Hold never = waiter.hold(Clock::now() + 200ms);
    ADD_FAILURE() << "got a mutex that was held";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kTimedOut);
    EXPECT_NE(std::string(error.what()).find(".acquire.lock"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace gpulock
