// What a waiter sleeps on (src/local/wait_channel.h): ended leases, the waiter before it (a
// pidfd), its wake FIFO.
#include "local/wait_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "inotify_instances.h"
#include "local/lock_directory.h"
#include "local/queue_directory.h"
#include "process/process_identity.h"
#include "queue/ticket.h"
#include "temp_dir.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using test_support::InotifyInstances;
using test_support::InotifyInstancesFallTo;
using test_support::TempDir;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Long enough never to pass before an event that does come; the test then fails, it doesn't hang.
constexpr milliseconds kLong{30000};
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
    // Whether the event had come is a flag, not a clock: a thread held off the CPU for a while
    // on a loaded machine must not read as a wait that ended early.
    std::atomic<bool> sent{false};
    std::thread actor([&] {
      std::this_thread::sleep_for(milliseconds(100));
      sent = true;
      event();
    });
    const WaitChannel::Wakeup woke = channel_.wait(wake_fd, kLong);
    const bool came = sent;
    actor.join();
    EXPECT_TRUE(came) << "woke before " << what;
    EXPECT_FALSE(woke.timed_out()) << what << " did not wake the wait";
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

// --- the watched waiter (the ring) -------------------------------------------------------

// A child process that sleeps until killed: a waiter as another waiter sees it.
pid_t SpawnSleeper() {
  const pid_t child = ::fork();
  if (child == 0) {
    // Never outlives the test (an ASSERT that returns early skips its KillAndReap), and never
    // holds the test's output open: ctest waits for that to close.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int null = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
    while (true) ::pause();
  }
  return child;
}

void KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

TEST_F(WaitChannelTest, EndOfWatchedProcessWakesWithQueueChange) {
  const pid_t other = SpawnSleeper();
  ASSERT_GT(other, 0);
  ASSERT_TRUE(channel_.watch_process(*process_id_of(other)));
  ExpectStaysAsleep();
  const WaitChannel::Wakeup woke =
      WaitAcross([&] { ::kill(other, SIGKILL); }, -1, "the watched process died");
  EXPECT_TRUE(woke.queue_change);
  EXPECT_FALSE(woke.release);
  EXPECT_FALSE(channel_.watching_process());
  KillAndReap(other);
  ExpectStaysAsleep();  // a process that ended wakes once, not for ever
}

TEST_F(WaitChannelTest, WatchProcessOfEndedProcessReturnsFalse) {
  const pid_t other = SpawnSleeper();
  ASSERT_GT(other, 0);
  const ProcessId id = *process_id_of(other);
  KillAndReap(other);
  EXPECT_FALSE(channel_.watch_process(id));
}

TEST_F(WaitChannelTest, WatchProcessOfAReusedPidReturnsFalse) {
  // The pid is there, but another process (another start time) has it now.
  ProcessId reused = self_process_id();
  reused.start_ticks += 1;
  EXPECT_FALSE(channel_.watch_process(reused));
  EXPECT_FALSE(channel_.watching_process());
}

TEST_F(WaitChannelTest, WatchProcessZeroStopsWatching) {
  const pid_t other = SpawnSleeper();
  ASSERT_TRUE(channel_.watch_process(*process_id_of(other)));
  EXPECT_TRUE(channel_.watch_process(ProcessId{}));
  KillAndReap(other);
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, WatchingAnotherProcessForgetsTheFirst) {
  const pid_t first = SpawnSleeper();
  const pid_t second = SpawnSleeper();
  ASSERT_TRUE(channel_.watch_process(*process_id_of(first)));
  ASSERT_TRUE(channel_.watch_process(*process_id_of(second)));
  KillAndReap(first);
  ExpectStaysAsleep();
  KillAndReap(second);
  EXPECT_TRUE(channel_.wait(-1, kLong).queue_change);
}

TEST_F(WaitChannelTest, ReleaseAndProcessEndTogetherReportBoth) {
  const pid_t other = SpawnSleeper();
  channel_.watch_releases(locks_.fd(), true);
  ASSERT_TRUE(channel_.watch_process(*process_id_of(other)));
  CloseWritten(LockPath("gpu-X.lock"));
  KillAndReap(other);
  const WaitChannel::Wakeup woke = channel_.wait(-1, kLong);
  EXPECT_TRUE(woke.release);
  EXPECT_TRUE(woke.queue_change);
}

// Issue 12: a thousand waiting jobs of one user must not need an inotify instance each (the
// default limit is 128 per user); only the dispatchers, which follow releases, hold one.
TEST_F(WaitChannelTest, AWaiterThatFollowsNoReleasesHoldsNoInotifyInstance) {
  // None held, once the closes of earlier tests' instances (in the background) are done.
  ASSERT_TRUE(InotifyInstancesFallTo(0)) << InotifyInstances() << " held";
  const int before = 0;
  const pid_t other = SpawnSleeper();
  OwnTicket mine = queue_->enter(MakeTicket(1));
  WaitChannel waiter;
  ASSERT_TRUE(waiter.watch_process(*process_id_of(other)));
  waiter.wait(mine.wake_fd(), milliseconds(10));
  EXPECT_EQ(InotifyInstances(), before);
  waiter.watch_releases(locks_.fd(), true);
  EXPECT_EQ(InotifyInstances(), before + 1);
  KillAndReap(other);
}

// A waiter that leaves the queue gives its instance back: kept by a process that waits no more,
// it counted against the user's limit as long as the process lived, and a pool of worker
// processes, each served once as a dispatcher, held all of them.
TEST_F(WaitChannelTest, AChannelDestroyedGivesTheInotifyInstanceBack) {
  // None held, once the closes of earlier tests' instances (in the background) are done.
  ASSERT_TRUE(InotifyInstancesFallTo(0)) << InotifyInstances() << " held";
  const int before = 0;
  {
    WaitChannel dispatcher;
    dispatcher.watch_releases(locks_.fd(), true);
    ASSERT_EQ(InotifyInstances(), before + 1);
  }
  EXPECT_TRUE(InotifyInstancesFallTo(before)) << InotifyInstances() << " held";
}

TEST_F(WaitChannelTest, AChildForkedWhileAChannelWatchesHoldsNoInotifyInstance) {
  ASSERT_TRUE(InotifyInstancesFallTo(0)) << InotifyInstances() << " held";
  WaitChannel dispatcher;
  dispatcher.watch_releases(locks_.fd(), true);
  ASSERT_EQ(InotifyInstances(), 1);
  // What Python multiprocessing does while another thread waits: fork, and no exec.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(InotifyInstances());
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "instances the child kept";
  EXPECT_EQ(InotifyInstances(), 1) << "the parent's own";
}

// A child forked by the waiting thread itself (from a progress hook, or a signal handler the
// interrupt hook runs) that then unwinds the wait destroys its copy of the channel. Fork closed
// the child's copy of the inotify instance, and its number may be the child's own file by then.
TEST_F(WaitChannelTest, AChannelDestroyedInAForkedChildClosesNoneOfTheChildsFiles) {
  auto dispatcher = std::make_unique<WaitChannel>();
  dispatcher->watch_releases(locks_.fd(), true);
  const pid_t child = ::fork();
  if (child == 0) {
    const int mine = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    dispatcher.reset();
    // A close in the background would come a little later.
    for (int i = 0; i < 100 && ::fcntl(mine, F_GETFD) != -1; ++i) ::usleep(2000);
    ::_exit(::fcntl(mine, F_GETFD) != -1 ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the channel closed a descriptor of the child's";
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
  const pid_t other = SpawnSleeper();
  channel_.watch_releases(locks_.fd(), true);
  ASSERT_TRUE(channel_.watch_process(*process_id_of(other)));
  const auto start = Clock::now();
  const WaitChannel::Wakeup woke = channel_.wait(mine.wake_fd(), milliseconds(300));
  const auto waited = Clock::now() - start;
  KillAndReap(other);
  EXPECT_TRUE(woke.timed_out());
  EXPECT_GE(waited, milliseconds(290));
  EXPECT_LT(waited, std::chrono::seconds(3));
}

TEST_F(WaitChannelTest, ZeroTimeoutReturnsAtOnce) {
  const auto start = Clock::now();
  EXPECT_TRUE(channel_.wait(-1, milliseconds(0)).timed_out());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));  // a hang, not a speed
}

// --- departures ---------------------------------------------------------------------------

TEST_F(WaitChannelTest, AWaiterLeavingWakesADispatcherWithQueueChange) {
  channel_.watch_releases(locks_.fd(), true);
  OwnTicket other = queue_->enter(MakeTicket(1));
  ExpectStaysAsleep();  // joining announces nothing
  const WaitChannel::Wakeup woke = WaitAcross([&] { other.leave(); }, -1, "the waiter left");
  EXPECT_TRUE(woke.queue_change);
  EXPECT_FALSE(woke.release);
  ExpectStaysAsleep();
}

TEST_F(WaitChannelTest, WakingAWaiterDoesNotWakeTheDispatchers) {
  // A planner's wake writes to the waiter's FIFO and closes it: no departure.
  channel_.watch_releases(locks_.fd(), true);
  OwnTicket other = queue_->enter(MakeTicket(1));
  queue_->wake(other.ticket().id);
  ExpectStaysAsleep();
}

// A waiter in a child process, killed once it has forked a grandchild without exec (Python
// multiprocessing) that lives on: its departure is announced all the same, and only once its
// ticket is unlocked.
TEST_F(WaitChannelTest, AWaiterKilledWhileItsForkedChildLivesWakesADispatcher) {
  Ticket t = MakeTicket(1);
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  const pid_t waiter = ::fork();
  ASSERT_GE(waiter, 0);
  if (waiter == 0) {
    t.process = self_process_id();
    const auto queue = QueueDirectory::open(LockDirectory::open(locks_.path()), false);
    OwnTicket own = queue->enter(t);
    if (::fork() == 0) {
      // It outlives the test's wait (the test kills it), off the test's output.
      const int null = ::open("/dev/null", O_RDWR);
      for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
      const pid_t self = ::getpid();
      if (::write(ready[1], &self, sizeof self) != sizeof self) ::_exit(1);
      ::sleep(300);
      ::_exit(0);
    }
    while (true) ::pause();
  }
  struct KilledAtTheEnd {
    pid_t pid;
    ~KilledAtTheEnd() {
      if (pid > 0) ::kill(pid, SIGKILL);
    }
  };
  KilledAtTheEnd waiter_ends{waiter};  // unless the test kills and reaps it first
  ::close(ready[1]);
  pid_t grandchild = 0;
  ASSERT_EQ(::read(ready[0], &grandchild, sizeof grandchild), sizeof grandchild);
  ::close(ready[0]);
  const KilledAtTheEnd grandchild_ends{grandchild};
  ASSERT_TRUE(queue_->is_live(t.id));
  channel_.watch_releases(locks_.fd(), true);
  const WaitChannel::Wakeup woke =
      WaitAcross([&] { ::kill(waiter, SIGKILL); }, -1, "the waiter was killed");
  EXPECT_TRUE(woke.queue_change);
  EXPECT_FALSE(queue_->is_live(t.id)) << "announced before the ticket was unlocked";
  int status = 0;
  ASSERT_EQ(::waitpid(waiter, &status, 0), waiter);
  waiter_ends.pid = 0;
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

TEST_F(WaitChannelTest, EachWakeReasonIsReportedAsItsOwn) {
  OwnTicket mine = queue_->enter(MakeTicket(1));
  const auto woken_by = [&](WakeReason reason) {
    queue_->wake(mine.ticket().id, reason);
    return channel_.wait(mine.wake_fd(), kLong);
  };
  const WaitChannel::Wakeup plan = woken_by(WakeReason::kPlan);
  EXPECT_TRUE(plan.woken);
  EXPECT_FALSE(plan.promoted || plan.made_oldest);
  const WaitChannel::Wakeup dispatcher = woken_by(WakeReason::kDispatcher);
  EXPECT_TRUE(dispatcher.promoted);
  EXPECT_FALSE(dispatcher.woken || dispatcher.made_oldest);
  const WaitChannel::Wakeup oldest = woken_by(WakeReason::kOldest);
  EXPECT_TRUE(oldest.promoted && oldest.made_oldest) << "the oldest is a dispatcher too";
  EXPECT_FALSE(oldest.woken) << "no plan is asked for";
  EXPECT_TRUE(oldest.queue_change);
}

TEST_F(WaitChannelTest, AnotherWaitersWakeDoesNotWake) {
  OwnTicket mine = queue_->enter(MakeTicket(1));
  OwnTicket other = queue_->enter(MakeTicket(2));
  queue_->wake(other.ticket().id);
  ExpectStaysAsleep(mine.wake_fd());
  EXPECT_TRUE(Readable(other.wake_fd()));
}

}  // namespace
}  // namespace gpulock
