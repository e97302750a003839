// What a waiter sleeps on (src/queue/wait_channel.h): ended leases, a watched ticket, its wake
// FIFO.
#include "local/wait_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "local/lock_directory.h"
#include "process/process_identity.h"
#include "local/queue_directory.h"
#include "queue/ticket.h"
#include "temp_dir.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Long enough never to pass before an event that does come; the test then fails, it doesn't hang.
constexpr milliseconds kLong{5000};
// How long a wait must stay asleep when nothing it watches happens.
constexpr milliseconds kShort{300};

Ticket MakeTicket(std::uint64_t seq) {
  Ticket t;
  t.id = make_lease_id();
  t.seq = seq;
  t.uid = ::geteuid();
  t.user = "tester";
  t.process = self_process_id();
  t.enqueued_at = 1700000000;
  t.candidates = {"GPU-5e1f0a7e-0000-4000-8000-000000000000"};
  return t;
}

// Opens the file for writing (creating it) and closes it, as a lease's end closes its lock file.
void CloseWritten(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::close(fd), 0);
}

// Opens the file read-only and closes it, as `gpulock status` inspects a lock file.
void CloseRead(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::close(fd), 0);
}

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

class WaitChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    queue_ = QueueDirectory::open(locks_, /*create=*/true);
    ASSERT_NE(queue_, nullptr);
  }
  fs::path LockPath(const std::string& name) const { return locks_.path() / name; }

  // Waits, and checks that nothing woke the channel before the timeout.
  void ExpectStaysAsleep(int wake_fd = -1) {
    const WaitChannel::Wakeup woke = channel_.wait(wake_fd, kShort);
    EXPECT_TRUE(woke.timed_out()) << "release " << woke.release << ", queue_change "
                                  << woke.queue_change;
  }

  // Waits (up to kLong) while another thread does `event` 100 ms in; checks that the wait lasted
  // until the event and did not run into its timeout, and returns what woke it.
  WaitChannel::Wakeup WaitAcross(const std::function<void()>& event, int wake_fd = -1,
                                 const char* what = "the event") {
    std::thread actor([&] {
      std::this_thread::sleep_for(milliseconds(100));
      event();
    });
    const auto start = Clock::now();
    const WaitChannel::Wakeup woke = channel_.wait(wake_fd, kLong);
    const auto waited = Clock::now() - start;
    actor.join();
    EXPECT_GE(waited, milliseconds(50)) << "woke before " << what;
    EXPECT_LT(waited, kLong / 2);
    return woke;
  }

  TempDir temp_{"wait"};
  LockDirectory locks_ = LockDirectory::open(temp_.path() / "locks");
  std::unique_ptr<QueueDirectory> queue_;
  WaitChannel channel_;
};

// --- ended leases -------------------------------------------------------------------------

TEST_F(WaitChannelTest, ClosingAWrittenLockFileWakesWithRelease) {
  channel_.watch_releases(locks_.fd(), true);
  CloseWritten(LockPath("gpu-GPU-0000.lock"));
  const auto start = Clock::now();
  const WaitChannel::Wakeup woke = channel_.wait(-1, kLong);
  EXPECT_TRUE(woke.release);
  EXPECT_FALSE(woke.queue_change);
  EXPECT_LT(Clock::now() - start, kLong / 2);
}

TEST_F(WaitChannelTest, ReleaseWakesASleepingWait) {
  channel_.watch_releases(locks_.fd(), true);
  const WaitChannel::Wakeup woke =
      WaitAcross([&] { CloseWritten(LockPath("gpu-X.lock")); }, -1, "the release");
  EXPECT_TRUE(woke.release);
}

TEST_F(WaitChannelTest, OtherFilesInTheLockDirectoryDoNotWake) {
  channel_.watch_releases(locks_.fd(), true);
  for (const char* name : {"notes.txt", ".acquire.lock", "gpu-.lock", "gpu-X.lock.tmp",
                           "GPU-X.lock", "queue/gpu-X.lock"}) {
    CloseWritten(LockPath(name));
  }
  ExpectStaysAsleep();
  // The control: a lock file does.
  CloseWritten(LockPath("gpu-X.lock"));
  EXPECT_TRUE(channel_.wait(-1, kLong).release);
}

TEST_F(WaitChannelTest, ReadingALockFileDoesNotWake) {
  CloseWritten(LockPath("gpu-X.lock"));
  channel_.watch_releases(locks_.fd(), true);
  CloseRead(LockPath("gpu-X.lock"));
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, ReleasesAreNotWatchedUntilAsked) {
  CloseWritten(LockPath("gpu-X.lock"));
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, WatchReleasesOffStopsIt) {
  EXPECT_TRUE(channel_.watch_releases(locks_.fd(), true));
  EXPECT_FALSE(channel_.watch_releases(locks_.fd(), false));
  CloseWritten(LockPath("gpu-X.lock"));
  ExpectStaysAsleep();
  // And on again: a new start, which the caller must follow by a look at the locks.
  EXPECT_TRUE(channel_.watch_releases(locks_.fd(), true));
  CloseWritten(LockPath("gpu-X.lock"));
  EXPECT_TRUE(channel_.wait(-1, kLong).release);
}

TEST_F(WaitChannelTest, WatchReleasesTwiceWatchesOnce) {
  EXPECT_FALSE(channel_.watch_releases(locks_.fd(), false)) << "was not watching";
  EXPECT_TRUE(channel_.watch_releases(locks_.fd(), true)) << "started watching";
  EXPECT_FALSE(channel_.watch_releases(locks_.fd(), true)) << "was watching already";
  CloseWritten(LockPath("gpu-X.lock"));
  EXPECT_TRUE(channel_.wait(-1, kLong).release);
  ExpectStaysAsleep();  // the one event was consumed
}

// --- the watched ticket -------------------------------------------------------------------

TEST_F(WaitChannelTest, LeaveOfWatchedTicketWakesWithQueueChange) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  other.leave();
  const WaitChannel::Wakeup woke = channel_.wait(-1, kLong);
  EXPECT_TRUE(woke.queue_change);
  EXPECT_FALSE(woke.release);
}

TEST_F(WaitChannelTest, LeaveOfWatchedTicketWakesASleepingWait) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  const WaitChannel::Wakeup woke = WaitAcross([&] { other.leave(); }, -1, "the ticket left");
  EXPECT_TRUE(woke.queue_change);
}

TEST_F(WaitChannelTest, ClosingTheOwnersWriteDescriptorWakes) {
  const fs::path path = temp_.path() / "plain.ticket";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(channel_.watch_ticket(path.string()));
  ExpectStaysAsleep();
  ASSERT_EQ(::close(fd), 0);
  EXPECT_TRUE(channel_.wait(-1, kLong).queue_change);
}

TEST_F(WaitChannelTest, KilledWaiterWakesItsWatcher) {
  const Ticket t = MakeTicket(1);
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      const auto queue = QueueDirectory::open(LockDirectory::open(locks_.path()), false);
      OwnTicket own = queue->enter(t);
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
      while (true) ::pause();  // until SIGKILLed
    } catch (...) {
      ::_exit(1);
    }
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "the child could not enter the queue";
  ::close(ready[0]);
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(t.id)));
  ExpectStaysAsleep();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  const WaitChannel::Wakeup woke = channel_.wait(-1, kLong);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(woke.queue_change) << "the watcher slept through its predecessor's death";
}

TEST_F(WaitChannelTest, ReadingTheWatchedTicketDoesNotWake) {
  // Everyone reads every ticket to plan the queue; that must not wake the watchers.
  OwnTicket other = queue_->enter(MakeTicket(1));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  EXPECT_EQ(queue_->list(false).live.size(), 1u);
  EXPECT_EQ(queue_->list(true).live.size(), 1u);
  EXPECT_TRUE(queue_->is_live(other.ticket().id));
  const auto fresh = QueueDirectory::open(LockDirectory::open(locks_.path()), false);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(fresh->list(false).live.size(), 1u);
  CloseRead(queue_->path() / (other.ticket().id + ".ticket"));
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, OtherTicketsLeavingDoNotWake) {
  OwnTicket watched = queue_->enter(MakeTicket(1));
  OwnTicket other = queue_->enter(MakeTicket(2));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(watched.ticket().id)));
  other.leave();
  OwnTicket newcomer = queue_->enter(MakeTicket(3));
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, WatchTicketOfMissingPathReturnsFalse) {
  EXPECT_FALSE(channel_.watch_ticket(queue_->watch_path(make_lease_id())));
  EXPECT_FALSE(channel_.watch_ticket((temp_.path() / "no-such.ticket").string()));
}

TEST_F(WaitChannelTest, WatchTicketOfLeftWaiterReturnsFalse) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  const std::string path = queue_->watch_path(other.ticket().id);
  other.leave();
  EXPECT_FALSE(channel_.watch_ticket(path));
}

// Found failing: once a watched ticket is gone (the kernel drops the watch with it), watching the
// same path again returns true from the "already watching it" shortcut in watch_ticket(), though
// the ticket is gone and nothing is watched; the header promises false. GpuPool's caller checks
// is_live() after it, so the queue itself copes.
TEST_F(WaitChannelTest, WatchTicketAgainAfterItLeftReturnsFalse) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  const std::string path = queue_->watch_path(other.ticket().id);
  ASSERT_TRUE(channel_.watch_ticket(path));
  other.leave();
  ASSERT_TRUE(channel_.wait(-1, kLong).queue_change);
  EXPECT_FALSE(channel_.watch_ticket(path));
}

TEST_F(WaitChannelTest, WatchTicketEmptyStopsWatching) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  EXPECT_TRUE(channel_.watch_ticket(""));
  other.leave();
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, WatchingAnotherTicketForgetsTheFirst) {
  OwnTicket first = queue_->enter(MakeTicket(1));
  OwnTicket second = queue_->enter(MakeTicket(2));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(first.ticket().id)));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(second.ticket().id)));
  first.leave();
  ExpectStaysAsleep();
  second.leave();
  EXPECT_TRUE(channel_.wait(-1, kLong).queue_change);
}

TEST_F(WaitChannelTest, ReleaseAndLeaveTogetherReportBoth) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  channel_.watch_releases(locks_.fd(), true);
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  CloseWritten(LockPath("gpu-X.lock"));
  other.leave();
  const WaitChannel::Wakeup woke = channel_.wait(-1, kLong);
  EXPECT_TRUE(woke.release);
  EXPECT_TRUE(woke.queue_change);
}

// --- timing out ---------------------------------------------------------------------------

TEST_F(WaitChannelTest, NothingHappeningTimesOut) {
  const auto start = Clock::now();
  const WaitChannel::Wakeup woke = channel_.wait(-1, milliseconds(300));
  const auto waited = Clock::now() - start;
  EXPECT_TRUE(woke.timed_out());
  EXPECT_GE(waited, milliseconds(290));
  EXPECT_LT(waited, std::chrono::seconds(3));
}

TEST_F(WaitChannelTest, NothingHappeningWithEverySourceSetTimesOut) {
  OwnTicket mine = queue_->enter(MakeTicket(1));
  OwnTicket other = queue_->enter(MakeTicket(2));
  channel_.watch_releases(locks_.fd(), true);
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  const auto start = Clock::now();
  const WaitChannel::Wakeup woke = channel_.wait(mine.wake_fd(), milliseconds(300));
  const auto waited = Clock::now() - start;
  EXPECT_TRUE(woke.timed_out());
  EXPECT_GE(waited, milliseconds(290));
  EXPECT_LT(waited, std::chrono::seconds(3));
}

TEST_F(WaitChannelTest, ZeroTimeoutReturnsAtOnce) {
  const auto start = Clock::now();
  EXPECT_TRUE(channel_.wait(-1, milliseconds(0)).timed_out());
  EXPECT_LT(Clock::now() - start, milliseconds(200));
}

// --- the wake FIFO ------------------------------------------------------------------------

TEST_F(WaitChannelTest, WakeOfOwnTicketWakesWithQueueChange) {
  OwnTicket mine = queue_->enter(MakeTicket(1));
  queue_->wake(mine.ticket().id);
  const WaitChannel::Wakeup woke = channel_.wait(mine.wake_fd(), kLong);
  EXPECT_TRUE(woke.queue_change);
  EXPECT_FALSE(woke.release);
}

TEST_F(WaitChannelTest, WakeWakesASleepingWait) {
  OwnTicket mine = queue_->enter(MakeTicket(1));
  const std::string id = mine.ticket().id;
  const WaitChannel::Wakeup woke =
      WaitAcross([&] { queue_->wake(id); }, mine.wake_fd(), "the wake-up");
  EXPECT_TRUE(woke.queue_change);
}

TEST_F(WaitChannelTest, AByteOnAnyWakeDescriptorWakes) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_NONBLOCK | O_CLOEXEC), 0);
  UniqueFd read_end(fds[0]);
  UniqueFd write_end(fds[1]);
  ExpectStaysAsleep(read_end.get());
  const char byte = 1;
  ASSERT_EQ(::write(write_end.get(), &byte, 1), 1);
  EXPECT_TRUE(channel_.wait(read_end.get(), kLong).queue_change);
}

TEST_F(WaitChannelTest, AnotherWaitersWakeDoesNotWake) {
  OwnTicket mine = queue_->enter(MakeTicket(1));
  OwnTicket other = queue_->enter(MakeTicket(2));
  queue_->wake(other.ticket().id);
  ExpectStaysAsleep(mine.wake_fd());
  EXPECT_TRUE(Readable(other.wake_fd()));
}

// --- reset --------------------------------------------------------------------------------

TEST_F(WaitChannelTest, ResetForgetsAQueuedRelease) {
  channel_.watch_releases(locks_.fd(), true);
  CloseWritten(LockPath("gpu-X.lock"));
  channel_.reset();
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, ResetForgetsAQueuedTicketEvent) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  other.leave();
  channel_.reset();
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, ResetForgetsTheWatches) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  channel_.watch_releases(locks_.fd(), true);
  ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
  channel_.reset();
  CloseWritten(LockPath("gpu-X.lock"));
  other.leave();
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, WatchesWorkAgainAfterReset) {
  OwnTicket other = queue_->enter(MakeTicket(1));
  const std::string path = queue_->watch_path(other.ticket().id);
  channel_.watch_releases(locks_.fd(), true);
  ASSERT_TRUE(channel_.watch_ticket(path));
  channel_.reset();
  // The same watches as before the reset: they must really be set up again.
  EXPECT_TRUE(channel_.watch_releases(locks_.fd(), true));
  ASSERT_TRUE(channel_.watch_ticket(path));
  CloseWritten(LockPath("gpu-X.lock"));
  EXPECT_TRUE(channel_.wait(-1, kLong).release);
  other.leave();
  EXPECT_TRUE(channel_.wait(-1, kLong).queue_change);
}

TEST_F(WaitChannelTest, ResetChannelServesManyWaitersInTurn) {
  // GpuPool keeps channels for reuse: each waiter's events are its own.
  for (int round = 0; round < 5; ++round) {
    OwnTicket other = queue_->enter(MakeTicket(static_cast<std::uint64_t>(round) + 1));
    ASSERT_TRUE(channel_.watch_ticket(queue_->watch_path(other.ticket().id)));
    channel_.watch_releases(locks_.fd(), round % 2 == 0);
    CloseWritten(LockPath("gpu-X.lock"));
    other.leave();
    const WaitChannel::Wakeup woke = channel_.wait(-1, kLong);
    EXPECT_TRUE(woke.queue_change) << "round " << round;
    EXPECT_EQ(woke.release, round % 2 == 0) << "round " << round;
    channel_.reset();
  }
}

}  // namespace
}  // namespace gpulock
