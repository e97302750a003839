// LocalBackend's plan of an acquire covers only the head of a long queue (plan_head in
// src/local/local_queue.cc): these tests queue more waiters than its first head holds and check
// that the plan still decides and reports as the plan of the whole queue would. The waiters are
// registered from this process through a QueueDirectory of its own (OFD locks of different open
// file descriptions conflict within one process too, so the pool sees them as live).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "gpu_pool_test_support.h"
#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"
#include "local/lock_directory.h"
#include "local/queue_directory.h"
#include "process/process_identity.h"
#include "temp_dir.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

using namespace test_support;

class LocalPlanHeadTest : public ::testing::Test {
 protected:
  PoolOptions Options() const {
    PoolOptions options;
    options.lock_dir = lock_dir_;
    return options;
  }

  // The backup dispatchers' delay and the safety re-check an hour each: a waiter that acts on a
  // release sooner does so for another reason.
  PoolOptions SlowBackupOptions() const {
    PoolOptions options = Options();
    options.backup_dispatcher_delay = std::chrono::hours(1);
    options.safety_recheck_interval = std::chrono::hours(1);
    return options;
  }

  // Hooks that interrupt a wait after a minute: a hang guard for waits bounded by neither.
  static WaitHooks GiveUpAfterAMinute() {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    WaitHooks hooks;
    hooks.interrupted = [give_up] { return std::chrono::steady_clock::now() >= give_up; };
    hooks.interrupt_poll = milliseconds(100);
    return hooks;
  }

  // Registers a waiter of this user for one of `candidates` (all of them when `named`), with no
  // health filter but the default one (no processes outside gpulock) unless `allow_foreign`.
  void Wait(std::vector<std::string> candidates, bool named, bool allow_foreign = false,
            bool entered_over_limit = false) {
    if (!queue_) {
      locks_.emplace(LockDirectory::open(lock_dir_));
      queue_ = QueueDirectory::open(*locks_, true);
    }
    Ticket t;
    t.id = make_lease_id();
    t.uid = ::geteuid();
    t.process = self_process_id();
    t.needed = 1;
    t.named_gpus = named;
    t.allow_foreign_processes = allow_foreign;
    t.entered_over_limit = entered_over_limit;
    t.candidates = std::move(candidates);
    waiters_.push_back(queue_->enter(t));
  }

  // (Re)writes the simulated GPUs' file (docs/simulated-gpus.md) in one rename, so that a
  // reader sees the old file or the new one; returns its path.
  std::filesystem::path WriteGpus(const char* json) const {
    const std::filesystem::path next = temp_.path() / "gpus.json.new";
    std::ofstream(next) << json;
    std::filesystem::rename(next, gpus_);
    return gpus_;
  }

  TempDir temp_;
  std::filesystem::path gpus_ = temp_.path() / "gpus.json";
  std::filesystem::path lock_dir_ = temp_.path() / "locks";
  std::optional<LockDirectory> locks_;
  std::unique_ptr<QueueDirectory> queue_;
  std::vector<OwnTicket> waiters_;
};

// 40 waiters for the held GPU 0 alone, then one for any GPU: that one is served GPU 1, free,
// though it stands behind the first head of the order; a newcomer is not.
TEST_F(LocalPlanHeadTest, AWaiterBehindTheFirstHeadTakesTheFreeGpuBeforeANewcomer) {
  GpuPool pool(make_simulated_source(2), Options());
  Lease holder = pool.acquire(Named({SimUuid(0)}));
  for (int i = 0; i < 40; ++i) Wait({SimUuid(0)}, true);
  GpuPool newcomer(make_simulated_source(2), Options());
  // With nobody else for GPU 1, the newcomer takes it.
  newcomer.acquire(Count(1)).release();
  Wait({SimUuid(0), SimUuid(1)}, false);
  ExpectError([&] { newcomer.acquire(Count(1)); }, ErrorCode::kTimedOut, "not free now");
}

// 40 waiters for any GPU behind held GPU 0, while free GPU 1 runs a process outside gpulock that
// their default filter refuses: a newcomer that allows such processes takes GPU 1 (the plan
// passes over the 40 by their slots' hints), but not once a waiter that allows them stands
// behind the 40.
TEST_F(LocalPlanHeadTest, WaitersWhoseFilterRefusesTheFreeGpuArePassedOverButNotOneThatTakesIt) {
  const std::filesystem::path gpus = WriteGpus(R"({"gpus": [{}, {"processes": [{"pid": 4711}]}]})");
  GpuPool pool(make_simulated_source_from_file(gpus.string()), Options());
  Lease holder = pool.acquire(Named({SimUuid(0)}));
  for (int i = 0; i < 40; ++i) Wait({SimUuid(0), SimUuid(1)}, false);
  GpuPool newcomer(make_simulated_source_from_file(gpus.string()), Options());
  LeaseRequest allowing = Count(1);
  allowing.allow_foreign_processes = true;
  Lease taken = newcomer.acquire(allowing);
  EXPECT_EQ(taken.gpus().front().uuid, SimUuid(1));
  taken.release();
  Wait({SimUuid(0), SimUuid(1)}, false, true);
  ExpectError([&] { newcomer.acquire(allowing); }, ErrorCode::kTimedOut, "not free now");
}

// A waiter left out of the walk only because a free GPU fails its health filter still makes the
// dispatchers re-read the devices every health_recheck_interval, as a walked one does: once the
// process outside gpulock leaves that GPU, the waiter is served (not at the next safety re-check,
// 10 minutes here). Three real waiters for held GPU 0 are the oldest, so the dispatchers; 32 more
// named GPU 0; then W, for any GPU. A departure makes the dispatchers plan with W in the queue.
TEST_F(LocalPlanHeadTest, AWaiterLeftOutForItsHealthKeepsTheDispatchersRecheckingHealth) {
  const std::filesystem::path gpus = WriteGpus(R"({"gpus": [{}, {"processes": [{"pid": 4711}]}]})");
  PoolOptions options = Options();
  options.health_recheck_interval = milliseconds(50);
  options.safety_recheck_interval = std::chrono::minutes(10);
  const auto source = [&] { return make_simulated_source_from_file(gpus.string()); };
  GpuPool holder_pool(source(), options);
  Lease holder = holder_pool.acquire(Named({SimUuid(0)}));
  std::vector<std::unique_ptr<GpuPool>> pools;
  std::vector<std::unique_ptr<BackgroundAcquire>> dispatchers;
  for (int i = 0; i < 3; ++i) {
    pools.push_back(std::make_unique<GpuPool>(source(), options));
    dispatchers.push_back(
        std::make_unique<BackgroundAcquire>(*pools.back(), Waiting(Named({SimUuid(0)}))));
    dispatchers.back()->WaitUntilWaiting();
  }
  for (int i = 0; i < 32; ++i) Wait({SimUuid(0)}, true);
  GpuPool w_pool(source(), options);
  LeaseRequest any = Count(1);
  any.wait = true;
  any.timeout = std::chrono::seconds(30);
  BackgroundAcquire w(w_pool, any);
  w.WaitUntilWaiting();
  waiters_.erase(waiters_.begin());  // a departure: the dispatchers plan, W behind their head
  std::this_thread::sleep_for(std::chrono::seconds(1));  // for them to plan and go to sleep
  WriteGpus(R"({"gpus": [{}, {}]})");                    // the process outside gpulock ends
  std::optional<Lease>& got = w.Finish();
  ASSERT_TRUE(got) << Describe(w.failure());
  EXPECT_EQ(got->gpus().front().uuid, SimUuid(1));
  got->release();
  holder.release();
  for (auto& d : dispatchers)
    if (std::optional<Lease>& lease = d->Finish()) lease->release();
}

// Whether a waiter's FIFO has a wake byte, within `ms`.
bool Woken(const OwnTicket& waiter, int ms) {
  pollfd p{waiter.wake_fd(), POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

// A waiter held back by its user's max_waiting stands last, behind the head: a newcomer's plan
// still wakes it once there is room for it (it then registers again), and not before. (The
// newcomer, of the same user, counts too: it would wait if not served.)
TEST_F(LocalPlanHeadTest, AHeldBackWaiterBehindTheHeadIsWokenOnceThereIsRoom) {
  PoolOptions options = Options();
  Config config;
  config.default_limits.max_waiting = 40;
  options.config = config;
  GpuPool pool(make_simulated_source(1), options);
  Lease holder = pool.acquire(Count(1));
  for (int i = 0; i < 40; ++i) Wait({SimUuid(0)}, false);
  Wait({SimUuid(0)}, false, false, true);  // registered while its user was at the limit
  GpuPool newcomer(make_simulated_source(1), options);
  waiters_.erase(waiters_.begin());  // the first waiter leaves: room, but for the newcomer
  ExpectError([&] { newcomer.acquire(Count(1)); }, ErrorCode::kTimedOut, "not free now");
  EXPECT_FALSE(Woken(waiters_.back(), 0)) << "no room yet";
  waiters_.erase(waiters_.begin());  // the second leaves: room for it too
  ExpectError([&] { newcomer.acquire(Count(1)); }, ErrorCode::kTimedOut, "not free now");
  EXPECT_TRUE(Woken(waiters_.back(), 1000));
}

// The oldest waiter, served, tells the next one that it is the oldest now, so that it acts on
// releases at once instead of after the backup dispatchers' delay. (Before, with several GPUs,
// releases in the moment between the two waited that long.)
TEST_F(LocalPlanHeadTest, TheOldestWaiterServedTellsTheNextThatItIsTheOldestNow) {
  GpuPool pool(make_simulated_source(1), Options());
  Lease holder = pool.acquire(Count(1));
  GpuPool oldest_pool(make_simulated_source(1), Options());
  BackgroundAcquire oldest(oldest_pool, Waiting(Count(1)));
  oldest.WaitUntilWaiting();
  Wait({SimUuid(0)}, false);
  holder.release();
  std::optional<Lease>& got = oldest.Finish();
  ASSERT_TRUE(got) << Describe(oldest.failure());
  std::string bytes;
  while (Woken(waiters_.back(), bytes.empty() ? 10000 : 0)) {
    char buffer[64];
    const ssize_t n = ::read(waiters_.back().wake_fd(), buffer, sizeof buffer);
    if (n <= 0) break;
    bytes.append(buffer, static_cast<std::size_t>(n));
  }
  EXPECT_NE(bytes.find(static_cast<char>(WakeReason::kOldest)), std::string::npos)
      << bytes.size() << " wake bytes, none saying so";
  got->release();
}

// The other side of that message: the waiter told that it is the oldest now acts on the next
// release at once. Here the backups' delay and the safety re-check are an hour each: a second
// waiter that stayed a backup would let the first one's release wait that long. (Its own interrupt
// ends the wait after a minute, a hang guard: acting at once takes milliseconds. A timeout would
// not do: the last look at the deadline would serve it.)
TEST_F(LocalPlanHeadTest, AWaiterToldItIsTheOldestNowActsOnTheNextReleaseAtOnce) {
  const PoolOptions options = SlowBackupOptions();
  GpuPool pool(make_simulated_source(1), options);
  Lease holder = pool.acquire(Count(1));
  GpuPool first_pool(make_simulated_source(1), options);
  BackgroundAcquire first(first_pool, Waiting(Count(1)));
  first.WaitUntilWaiting();
  GpuPool second_pool(make_simulated_source(1), options);
  BackgroundAcquire second(second_pool, Waiting(Count(1)), GiveUpAfterAMinute());
  second.WaitUntilWaiting();  // a backup dispatcher, behind the first
  holder.release();
  std::optional<Lease>& got = first.Finish();
  ASSERT_TRUE(got) << Describe(first.failure());
  got->release();
  std::optional<Lease>& next = second.Finish();
  ASSERT_TRUE(next) << Describe(second.failure());
  next->release();
}

// A backup dispatcher's delay ends with the request's deadline: a waiter behind a stopped oldest
// waiter, with a delay far longer than its timeout, times out on time. (Its interrupt, after a
// minute, is the hang guard.)
TEST_F(LocalPlanHeadTest, ABackupDispatchersDelayEndsWithItsDeadline) {
  const PoolOptions options = SlowBackupOptions();
  GpuPool pool(make_simulated_source(1), options);
  Lease holder = pool.acquire(Count(1));
  Wait({SimUuid(0)}, false);  // the oldest waiter, which never acts (this thread plans nothing)
  GpuPool backup_pool(make_simulated_source(1), options);
  LeaseRequest request = Count(1);
  request.wait = true;
  request.timeout = std::chrono::seconds(2);
  BackgroundAcquire backup(backup_pool, request, GiveUpAfterAMinute());
  backup.WaitUntilWaiting();
  holder.release();  // a release: the backup waits for the oldest waiter, until its deadline
  EXPECT_FALSE(backup.Finish());
  ExpectError([&] { std::rethrow_exception(backup.failure()); }, ErrorCode::kTimedOut,
              "within the timeout");
}

// Each lease writes its record into the GPU's lock file as it begins, so the file's mtime says
// when the GPU was last leased; the plan gives the free GPU leased longest ago first. With a
// waiter queued (for held GPU 0 alone), a newcomer is planned: it takes GPU 2, leased an hour
// ago, before GPU 1, leased half an hour ago; then GPU 2 is the newest, and GPU 1 comes next.
TEST_F(LocalPlanHeadTest, ANewcomerBehindWaitersTakesTheFreeGpuLeasedLongestAgo) {
  GpuPool pool(make_simulated_source(3), Options());
  pool.acquire(Named({SimUuid(1), SimUuid(2)})).release();  // creates their lock files
  const LockDirectory locks = LockDirectory::open(lock_dir_);
  const auto set_leased_ago = [&](const std::string& uuid, int seconds) {
    timespec times[2] = {{0, UTIME_OMIT}, {::time(nullptr) - seconds, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, locks.lock_file_path(uuid).c_str(), times, 0), 0);
  };
  set_leased_ago(SimUuid(1), 1800);
  set_leased_ago(SimUuid(2), 3600);
  Lease holder = pool.acquire(Named({SimUuid(0)}));
  Wait({SimUuid(0)}, true);
  GpuPool newcomer(make_simulated_source(3), Options());
  Lease first = newcomer.acquire(Count(1));
  EXPECT_EQ(first.gpus().front().uuid, SimUuid(2));
  first.release();
  Lease second = newcomer.acquire(Count(1));
  EXPECT_EQ(second.gpus().front().uuid, SimUuid(1));
}

// The position a waiter is told counts the whole queue, not the head that was planned.
TEST_F(LocalPlanHeadTest, PositionCountsTheWholeQueue) {
  GpuPool pool(make_simulated_source(1), Options());
  Lease holder = pool.acquire(Count(1));
  for (int i = 0; i < 100; ++i) Wait({SimUuid(0)}, false);
  GpuPool newcomer(make_simulated_source(1), Options());
  LeaseRequest request = Count(1);
  request.wait = true;
  request.timeout = std::chrono::milliseconds(1);
  ExpectError([&] { newcomer.acquire(request); }, ErrorCode::kTimedOut,
              "(position 101 of 101 in the queue)");
}

}  // namespace
}  // namespace gpulock
