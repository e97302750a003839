// GpuPool (include/gpulock/gpu_pool.hpp) over simulated GPUs and a fresh lock directory:
// acquiring all-or-nothing, waiting and being woken, status, release, CUDA_VISIBLE_DEVICES and
// health filters. No test depends on how fast anything happens: waits are ended by events
// (a release, a changed file, an interrupt hook), and timeouts are only hang guards.
#include "gpulock/gpu_pool.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "gpulock/error.hpp"
#include "local/gpu_lock_file.h"
#include "backend/holder_record.h"
#include "local/lock_directory.h"
#include "process/process_identity.h"
#include "temp_dir.h"
#include "util/fd.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr std::uint64_t kGiB = 1024ULL * 1024 * 1024;
// Long enough never to be reached by a test that works; only a guard against hanging forever.
constexpr milliseconds kHangGuard = std::chrono::minutes(5);

// The UUIDs of make_simulated_source() (docs/simulated-gpus.md).
std::string SimUuid(unsigned index) {
  return "GPU-5e1f0a7e-0000-4000-8000-00000000000" + std::to_string(index);
}

using test_support::TempDir;

// A forked child that does nothing until it is destroyed (then it exits and is reaped).
class IdleChild {
 public:
  IdleChild() {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(fds[1]);
      char c;
      while (::read(fds[0], &c, 1) < 0 && errno == EINTR) {
      }
      ::_exit(0);
    }
    ::close(fds[0]);
    write_end_ = fds[1];
  }
  ~IdleChild() {
    ::close(write_end_);  // the child reads end-of-file and exits
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pid_t pid() const { return pid_; }
  // True while the child has not exited (or been killed).
  bool running() const {
    int status = 0;
    return ::waitpid(pid_, &status, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
  int write_end_ = -1;
};

LeaseRequest Count(unsigned count) {
  LeaseRequest request;
  request.count = count;
  request.wait = false;
  return request;
}

LeaseRequest Named(std::vector<std::string> gpus) {
  LeaseRequest request;
  request.gpus = std::move(gpus);
  request.wait = false;
  return request;
}

// A request that waits (up to the hang guard).
LeaseRequest Waiting(LeaseRequest request) {
  request.wait = true;
  request.timeout = kHangGuard;
  return request;
}

std::vector<unsigned> Indices(const Lease& lease) {
  std::vector<unsigned> out;
  for (const auto& gpu : lease.gpus()) out.push_back(gpu.index);
  return out;
}

class GpuPoolTest : public ::testing::Test {
 protected:
  PoolOptions Options() const {
    PoolOptions options;
    options.lock_dir = lock_dir_;
    return options;
  }

  GpuPool Pool(unsigned count) { return GpuPool(make_simulated_source(count), Options()); }

  // Writes the simulated GPU file (atomically: a running pool re-reads it on every query).
  void WriteGpus(const std::string& json) {
    const fs::path temporary = gpus_file_.string() + ".new";
    std::ofstream(temporary) << json;
    fs::rename(temporary, gpus_file_);
  }

  GpuPool PoolFromFile(const std::string& json, PoolOptions options) {
    WriteGpus(json);
    return GpuPool(make_simulated_source_from_file(gpus_file_.string()), std::move(options));
  }
  GpuPool PoolFromFile(const std::string& json) { return PoolFromFile(json, Options()); }

  fs::path LockFile(const std::string& uuid) const {
    return lock_dir_ / LockDirectory::lock_file_name(uuid);
  }

  // Overwrites the record in a GPU's lock file, as anyone able to open it could.
  void WriteRecordBytes(const std::string& uuid, const std::string& bytes) {
    UniqueFd fd(::open(LockFile(uuid).c_str(), O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid()) << LockFile(uuid);
    ASSERT_EQ(write_record_bytes(fd.get(), bytes), std::nullopt);
  }

  TempDir temp_;
  fs::path lock_dir_ = temp_.path() / "locks";
  fs::path gpus_file_ = temp_.path() / "gpus.json";
};

// Runs pool.acquire(request, hooks) in a thread; Wait() returns once the acquire has reported
// that it is waiting (or has finished).
class BackgroundAcquire {
 public:
  BackgroundAcquire(GpuPool& pool, LeaseRequest request, WaitHooks hooks = {}) {
    auto user_progress = hooks.on_progress;
    hooks.on_progress = [this, user_progress](const WaitProgress& progress) {
      if (user_progress) user_progress(progress);
      Signal();
    };
    thread_ = std::thread([this, &pool, request = std::move(request), hooks = std::move(hooks)] {
      try {
        lease_.emplace(pool.acquire(request, hooks));
      } catch (...) {
        failure_ = std::current_exception();
      }
      Signal();
    });
  }
  ~BackgroundAcquire() {
    if (thread_.joinable()) thread_.join();
  }

  void WaitUntilWaiting() { waiting_.get_future().wait(); }
  // Joins the thread; the lease it got, or nullopt (failure() says why).
  std::optional<Lease>& Finish() {
    thread_.join();
    return lease_;
  }
  std::exception_ptr failure() const { return failure_; }

 private:
  void Signal() {
    std::call_once(signalled_, [this] { waiting_.set_value(); });
  }

  std::promise<void> waiting_;
  std::once_flag signalled_;
  std::optional<Lease> lease_;
  std::exception_ptr failure_;
  std::thread thread_;
};

std::string Describe(std::exception_ptr failure) {
  if (!failure) return "none";
  try {
    std::rethrow_exception(failure);
  } catch (const Error& error) {
    return std::string(error_code_name(error.code())) + ": " + error.what();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "unknown";
}

// --- acquiring ----------------------------------------------------------------------------

TEST_F(GpuPoolTest, AcquireOneGpu) {
  GpuPool pool = Pool(4);
  Lease lease = pool.acquire(Count(1));
  ASSERT_TRUE(lease.active());
  EXPECT_TRUE(is_lease_id(lease.id())) << lease.id();
  ASSERT_EQ(lease.gpus().size(), 1u);
  const LeasedGpu& gpu = lease.gpus()[0];
  EXPECT_EQ(gpu.index, 0u);
  EXPECT_EQ(gpu.display_index, "0");
  EXPECT_EQ(gpu.uuid, SimUuid(0));
  EXPECT_EQ(gpu.name, "Simulated GPU");
  EXPECT_FALSE(gpu.is_mig_instance);
  EXPECT_EQ(lease.uuid_list(), SimUuid(0));
  EXPECT_EQ(lease.cuda_visible_devices(), "0");
  EXPECT_EQ(lease.cuda_visible_devices(VisibleFormat::kUuid), SimUuid(0));
  EXPECT_EQ(lease.lock_fds().size(), 1u);
  EXPECT_NE(lease.started_at(), std::chrono::system_clock::time_point{});
}

TEST_F(GpuPoolTest, AcquireTwoGpus) {
  GpuPool pool = Pool(4);
  Lease lease = pool.acquire(Count(2));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{0, 1}));
  EXPECT_EQ(lease.uuid_list(), SimUuid(0) + "," + SimUuid(1));
  EXPECT_EQ(lease.cuda_visible_devices(), "0,1");
  EXPECT_EQ(lease.cuda_visible_devices(VisibleFormat::kUuid), SimUuid(0) + "," + SimUuid(1));
  EXPECT_EQ(lease.lock_fds().size(), 2u);
}

TEST_F(GpuPoolTest, LeasesTakeDistinctGpusAndHaveDistinctIds) {
  GpuPool pool = Pool(4);
  Lease a = pool.acquire(Count(1));
  Lease b = pool.acquire(Count(2));
  Lease c = pool.acquire(Count(1));
  EXPECT_EQ(Indices(a), (std::vector<unsigned>{0}));
  EXPECT_EQ(Indices(b), (std::vector<unsigned>{1, 2}));
  EXPECT_EQ(Indices(c), (std::vector<unsigned>{3}));
  EXPECT_NE(a.id(), b.id());
  EXPECT_NE(b.id(), c.id());
  ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut);
}

TEST_F(GpuPoolTest, ExplicitGpusByIndexUuidAndPrefix) {
  GpuPool pool = PoolFromFile(R"({"gpus": [{"uuid": "GPU-aaaa0000-0000-4000-8000-000000000000"},
    {"uuid": "GPU-bbbb0000-0000-4000-8000-000000000000"},
    {"uuid": "GPU-cccc0000-0000-4000-8000-000000000000"}]})");
  Lease by_index = pool.acquire(Named({"2"}));
  EXPECT_EQ(Indices(by_index), (std::vector<unsigned>{2}));
  Lease by_prefix = pool.acquire(Named({"gpu-BBBB"}));  // a unique prefix, any case
  EXPECT_EQ(Indices(by_prefix), (std::vector<unsigned>{1}));
  Lease by_uuid = pool.acquire(Named({"GPU-aaaa0000-0000-4000-8000-000000000000"}));
  EXPECT_EQ(Indices(by_uuid), (std::vector<unsigned>{0}));
}

TEST_F(GpuPoolTest, ExplicitGpusKeepTheRequestedOrder) {
  GpuPool pool = Pool(4);
  Lease lease = pool.acquire(Named({"3", "1"}));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{3, 1}));
  EXPECT_EQ(lease.cuda_visible_devices(), "3,1");
}

TEST_F(GpuPoolTest, PrefersGpusOnTheSameSwitch) {
  GpuPool pool =
      PoolFromFile(R"({"gpus": [{"switch": 0}, {"switch": 1}, {"switch": 0}, {"switch": 1}]})");
  Lease lease = pool.acquire(Count(2));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{0, 2}));
}

// Regression test for a fixed bug: GpuPool claims to be thread-safe (include/gpulock/gpu_pool.hpp),
// but with a file-backed simulated source, status() (and acquire()) from several threads call
// DeviceSource::devices() concurrently, and FileSimulatedSource::devices()
// (src/devices/simulated_device_source.cc) rewrites its switches_ map unsynchronised: the
// process aborts with heap corruption. See SimulatedFileTest.ConcurrentQueriesOnOneSource.
TEST_F(GpuPoolTest, ConcurrentStatusOnAFileBackedPool) {
  GpuPool pool = PoolFromFile(R"({"gpus": [{"switch": 0}, {"switch": 0}, {"switch": 1}]})");
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i)
        if (pool.status().gpus.size() != 3) ++wrong;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(GpuPoolTest, ConcurrentAcquiresInOnePoolGetDistinctGpus) {
  GpuPool pool = Pool(8);
  std::mutex mutex;
  std::vector<Lease> leases;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      try {
        Lease lease = pool.acquire(Count(1));
        std::lock_guard<std::mutex> guard(mutex);
        leases.push_back(std::move(lease));
      } catch (const std::exception& error) {
        std::lock_guard<std::mutex> guard(mutex);
        failures.push_back(error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, std::vector<std::string>{});
  std::set<unsigned> taken;
  for (const auto& lease : leases) taken.insert(lease.gpus().at(0).index);
  EXPECT_EQ(taken.size(), 8u);
}

// --- releasing ----------------------------------------------------------------------------

TEST_F(GpuPoolTest, ReleasedOnDestruction) {
  GpuPool pool = Pool(1);
  {
    Lease lease = pool.acquire(Count(1));
    ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut);
  }
  Lease again = pool.acquire(Count(1));
  EXPECT_EQ(Indices(again), (std::vector<unsigned>{0}));
}

TEST_F(GpuPoolTest, ReleasedOnMoveAssignment) {
  GpuPool pool = Pool(2);
  Lease lease = pool.acquire(Count(1));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{0}));
  lease = pool.acquire(Count(1));  // GPU 0 is still held while the new lease is taken
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{1}));
  const PoolStatus status = pool.status();
  EXPECT_EQ(status.gpus[0].state, GpuState::kFree) << "the overwritten lease was not released";
  EXPECT_EQ(status.gpus[1].state, GpuState::kLeased);
}

TEST_F(GpuPoolTest, MoveTransfersTheLease) {
  GpuPool pool = Pool(1);
  Lease a = pool.acquire(Count(1));
  const std::string id = a.id();
  Lease b(std::move(a));
  EXPECT_TRUE(b.active());
  EXPECT_EQ(b.id(), id);
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kLeased);
  Lease c;
  EXPECT_FALSE(c.active());
  EXPECT_TRUE(c.gpus().empty());
  EXPECT_EQ(c.id(), "");
  EXPECT_EQ(c.cuda_visible_devices(), "");
  c = std::move(b);
  EXPECT_EQ(c.id(), id);
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kLeased);
}

TEST_F(GpuPoolTest, ExplicitReleaseIsIdempotent) {
  GpuPool pool = Pool(1);
  Lease lease = pool.acquire(Count(1));
  lease.release();
  EXPECT_FALSE(lease.active());
  EXPECT_TRUE(lease.lock_fds().empty());
  lease.release();
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kFree);
  Lease again = pool.acquire(Count(1));
  EXPECT_TRUE(again.active());
}

// --- exclusion ----------------------------------------------------------------------------

TEST_F(GpuPoolTest, TwoPoolsInOneProcessExcludeEachOther) {
  GpuPool first = Pool(2);
  GpuPool second = Pool(2);
  Lease a = first.acquire(Count(1));
  Lease b = second.acquire(Count(1));
  EXPECT_EQ(Indices(a), (std::vector<unsigned>{0}));
  EXPECT_EQ(Indices(b), (std::vector<unsigned>{1}));
  ExpectError([&] { first.acquire(Count(1)); }, ErrorCode::kTimedOut, a.id());
  ExpectError([&] { second.acquire(Named({"0"})); }, ErrorCode::kTimedOut, a.id());
  a.release();
  Lease c = second.acquire(Named({"0"}));
  EXPECT_TRUE(c.active());
}

TEST_F(GpuPoolTest, AllOrNothing) {
  GpuPool pool = Pool(2);
  Lease held = pool.acquire(Named({"1"}));
  ExpectError([&] { pool.acquire(Named({"0", "1"})); }, ErrorCode::kTimedOut, "not free");
  ExpectError([&] { pool.acquire(Count(2)); }, ErrorCode::kTimedOut);
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kFree) << "a failed request kept GPU 0";
  Lease zero = pool.acquire(Named({"0"}));
  EXPECT_TRUE(zero.active());
}

TEST_F(GpuPoolTest, AllOrNothingAgainstALockOutsideTheProtocol) {
  // Someone locks GPU 1's file directly (no record, not via the acquire mutex).
  GpuPool pool = Pool(2);
  const LockDirectory dir = LockDirectory::open(lock_dir_);
  UniqueFd outside = dir.open_lock_file(SimUuid(1));
  ASSERT_TRUE(try_lock_exclusive(outside.get()));
  ExpectError(
      [&] {
        pool.acquire(Named({"0", "1"}));
      },
      ErrorCode::kTimedOut, "details unavailable");
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kFree);
  EXPECT_EQ(pool.status().gpus[1].state, GpuState::kLeased);
}

// --- refusals -----------------------------------------------------------------------------

TEST_F(GpuPoolTest, MoreGpusThanExistIsUnsatisfiable) {
  GpuPool pool = Pool(4);
  ExpectError([&] { pool.acquire(Waiting(Count(5))); }, ErrorCode::kUnsatisfiable, "5 GPUs");
  ExpectError([&] { pool.acquire(Waiting(Count(100000))); }, ErrorCode::kUnsatisfiable);
}

TEST_F(GpuPoolTest, CountZeroIsInvalid) {
  GpuPool pool = Pool(4);
  ExpectError([&] { pool.acquire(Count(0)); }, ErrorCode::kInvalidArgument);
}

TEST_F(GpuPoolTest, NegativeTimeoutIsInvalid) {
  GpuPool pool = Pool(1);
  LeaseRequest request = Waiting(Count(1));
  request.timeout = milliseconds(-1);
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kInvalidArgument, "timeout");
}

TEST_F(GpuPoolTest, HealthLimitsOutOfRangeAreInvalid) {
  GpuPool pool = Pool(1);
  LeaseRequest utilization = Count(1);
  utilization.max_utilization_percent = 101;
  ExpectError([&] { pool.acquire(utilization); }, ErrorCode::kInvalidArgument, "percentage");
  for (double watts : {-1.0, 2e6, std::numeric_limits<double>::quiet_NaN()}) {
    LeaseRequest power = Count(1);
    power.max_power_watts = watts;
    ExpectError([&] { pool.acquire(power); }, ErrorCode::kInvalidArgument, "power limit");
  }
  LeaseRequest bounds = Count(1);
  bounds.max_utilization_percent = 100;
  bounds.max_power_watts = 1e6;
  EXPECT_TRUE(pool.acquire(bounds).active());
}

TEST_F(GpuPoolTest, UnknownGpuIsUnsatisfiable) {
  GpuPool pool = Pool(2);
  ExpectError([&] { pool.acquire(Waiting(Named({"7"}))); }, ErrorCode::kUnsatisfiable, "'7'");
  ExpectError([&] { pool.acquire(Named({"GPU-ffff"})); }, ErrorCode::kUnsatisfiable, "GPU-ffff");
  ExpectError([&] { pool.acquire(Named({"0:1"})); }, ErrorCode::kUnsatisfiable);
  ExpectError([&] { pool.acquire(Named({"0", "9"})); }, ErrorCode::kUnsatisfiable);
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kFree);
}

TEST_F(GpuPoolTest, AmbiguousUuidPrefixIsInvalid) {
  GpuPool pool = Pool(2);
  ExpectError([&] { pool.acquire(Named({"GPU-5e1f"})); }, ErrorCode::kInvalidArgument,
              "several GPUs");
}

TEST_F(GpuPoolTest, DuplicateGpuIsInvalid) {
  GpuPool pool = Pool(2);
  ExpectError([&] { pool.acquire(Named({"0", "0"})); }, ErrorCode::kInvalidArgument, "twice");
  ExpectError(
      [&] {
        pool.acquire(Named({"1", SimUuid(1)}));
      },
      ErrorCode::kInvalidArgument, "twice");
}

TEST_F(GpuPoolTest, HostileGpuNamesAreShownSafely) {
  GpuPool pool = Pool(1);
  try {
    pool.acquire(Named({"\x1b[2J\x1b]0;x\x07"}));
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).find('\x1b'), std::string::npos) << error.what();
  }
}

// --- waiting ------------------------------------------------------------------------------

TEST_F(GpuPoolTest, TimeoutIsTimedOut) {
  GpuPool pool = Pool(1);
  Lease held = pool.acquire(Count(1));
  LeaseRequest request = Count(1);
  request.wait = true;
  request.timeout = milliseconds(20);
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kTimedOut, "within the timeout");
  request.timeout = milliseconds(0);
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kTimedOut, held.id());
}

TEST_F(GpuPoolTest, NoWaitFailsAtOnceNamingTheHolder) {
  GpuPool pool = Pool(1);
  LeaseRequest holding = Count(1);
  holding.label = "sweep";
  Lease held = pool.acquire(holding);
  ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut, "GPU 0: leased by");
  ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut, "'sweep'");
}

TEST_F(GpuPoolTest, WaitingAcquireInAnotherThreadIsServedAfterRelease) {
  GpuPool pool = Pool(1);
  std::optional<Lease> held(pool.acquire(Count(1)));
  const std::string held_id = held->id();
  BackgroundAcquire waiter(pool, Waiting(Count(1)));
  waiter.WaitUntilWaiting();
  held.reset();
  std::optional<Lease>& got = waiter.Finish();
  ASSERT_TRUE(got.has_value()) << Describe(waiter.failure());
  EXPECT_EQ(Indices(*got), (std::vector<unsigned>{0}));
  EXPECT_NE(got->id(), held_id);
}

TEST_F(GpuPoolTest, WaitingAcquireInAnotherPoolIsServedAfterRelease) {
  GpuPool holder_pool = Pool(2);
  GpuPool waiter_pool = Pool(2);
  std::optional<Lease> held(holder_pool.acquire(Count(2)));
  BackgroundAcquire waiter(waiter_pool, Waiting(Named({"1"})));
  waiter.WaitUntilWaiting();
  held.reset();
  std::optional<Lease>& got = waiter.Finish();
  ASSERT_TRUE(got.has_value()) << Describe(waiter.failure());
  EXPECT_EQ(Indices(*got), (std::vector<unsigned>{1}));
}

TEST_F(GpuPoolTest, ProgressNamesTheHolder) {
  GpuPool pool = Pool(2);
  LeaseRequest holding = Named({"1"});
  holding.label = "sweep";
  holding.command = "python train.py";
  Lease held = pool.acquire(holding);

  std::vector<WaitProgress> reports;
  WaitHooks hooks;
  hooks.on_progress = [&](const WaitProgress& progress) { reports.push_back(progress); };
  hooks.interrupted = [&] { return !reports.empty(); };  // stop once the wait was reported
  hooks.interrupt_poll = milliseconds(5);
  ExpectError([&] { pool.acquire(Waiting(Named({"0", "1"})), hooks); }, ErrorCode::kInterrupted);

  ASSERT_FALSE(reports.empty());
  const WaitProgress& progress = reports.front();
  ASSERT_EQ(progress.blocking.size(), 1u) << "only GPU 1 blocks; GPU 0 is free";
  const BlockingGpu& blocking = progress.blocking[0];
  EXPECT_EQ(blocking.display_index, "1");
  EXPECT_EQ(blocking.uuid, SimUuid(1));
  EXPECT_NE(blocking.reason.find(user_name(::geteuid())), std::string::npos) << blocking.reason;
  EXPECT_NE(blocking.reason.find(held.id()), std::string::npos) << blocking.reason;
  EXPECT_NE(blocking.reason.find("sweep"), std::string::npos) << blocking.reason;
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kFree);
}

TEST_F(GpuPoolTest, ProgressIsReportedOnlyWhenItChanges) {
  GpuPool pool = Pool(1);
  Lease held = pool.acquire(Count(1));
  // A record nobody can read: the reason ("details unavailable") then stays the same, where a
  // readable one would show the lease's age, which changes every second.
  WriteRecordBytes(SimUuid(0), std::string(kHolderRecordSize, '#'));
  int reports = 0, polls = 0;
  WaitHooks hooks;
  hooks.on_progress = [&](const WaitProgress&) { ++reports; };
  hooks.interrupted = [&] { return ++polls >= 5; };
  hooks.interrupt_poll = milliseconds(1);
  ExpectError([&] { pool.acquire(Waiting(Count(1)), hooks); }, ErrorCode::kInterrupted);
  EXPECT_EQ(reports, 1);
  EXPECT_EQ(polls, 5);
}

TEST_F(GpuPoolTest, InterruptedStopsTheWait) {
  GpuPool pool = Pool(1);
  Lease held = pool.acquire(Count(1));
  WaitHooks hooks;
  hooks.interrupted = [] { return true; };
  hooks.interrupt_poll = milliseconds(1);
  LeaseRequest forever = Count(1);
  forever.wait = true;  // no timeout at all: only the hook can end it
  ExpectError([&] { pool.acquire(forever, hooks); }, ErrorCode::kInterrupted);
  EXPECT_TRUE(held.active());
}

// A timeout too long for steady_clock (1000 years; parse_duration accepts up to 1e14 ms) means
// no deadline, not an overflow into an immediate time-out.
TEST_F(GpuPoolTest, HugeTimeoutWaits) {
  GpuPool pool = Pool(1);
  Lease held = pool.acquire(Count(1));
  for (const milliseconds timeout :
       {milliseconds(std::chrono::hours(24 * 365 * 1000)), milliseconds::max()}) {
    bool reported = false;
    WaitHooks hooks;
    hooks.on_progress = [&](const WaitProgress&) { reported = true; };
    hooks.interrupted = [&] { return reported; };
    hooks.interrupt_poll = milliseconds(1);
    LeaseRequest request = Count(1);
    request.wait = true;
    request.timeout = timeout;
    ExpectError([&] { pool.acquire(request, hooks); }, ErrorCode::kInterrupted);
  }
}

// --- status -------------------------------------------------------------------------------

TEST_F(GpuPoolTest, StatusShowsFreeAndLeasedWithHolder) {
  GpuPool pool = Pool(3);
  LeaseRequest request = Named({"1"});
  request.label = "nightly eval";
  request.command = "python eval.py --all";
  Lease lease = pool.acquire(request);

  const PoolStatus status = pool.status();
  EXPECT_TRUE(status.simulated);
  EXPECT_EQ(status.lock_dir, lock_dir_.string());
  EXPECT_EQ(status.host, host_name());
  EXPECT_EQ(status.device_source, "3 simulated GPUs");
  EXPECT_TRUE(status.warnings.empty());
  ASSERT_EQ(status.gpus.size(), 3u);
  for (unsigned i : {0u, 2u}) {
    EXPECT_EQ(status.gpus[i].state, GpuState::kFree) << i;
    EXPECT_FALSE(status.gpus[i].holder.has_value()) << i;
    EXPECT_EQ(status.gpus[i].device.uuid, SimUuid(i));
  }
  const GpuStatus& leased = status.gpus[1];
  EXPECT_EQ(leased.state, GpuState::kLeased);
  EXPECT_STREQ(gpu_state_name(leased.state), "leased");
  EXPECT_EQ(leased.note, "");
  ASSERT_TRUE(leased.holder.has_value());
  const HolderInfo& holder = *leased.holder;
  EXPECT_EQ(holder.lease_id, lease.id());
  EXPECT_EQ(holder.uid, ::geteuid());
  EXPECT_EQ(holder.user, user_name(::geteuid()));
  EXPECT_EQ(holder.host, host_name());
  EXPECT_EQ(holder.kind, "process");
  EXPECT_EQ(holder.pid, ::getpid());
  EXPECT_TRUE(holder.holder_alive);
  EXPECT_EQ(holder.label, "nightly eval");
  EXPECT_EQ(holder.command, "python eval.py --all");
  EXPECT_EQ(holder.gpus, (std::vector<std::string>{SimUuid(1)}));
  EXPECT_TRUE(holder.member_pids.empty());
  const auto skew = holder.started_at - lease.started_at();
  EXPECT_LT(std::chrono::abs(skew), milliseconds(1));
}

TEST_F(GpuPoolTest, StatusShowsHowTheLeaseIsHeldAndItsMembers) {
  GpuPool pool = Pool(1);
  Lease lease = pool.acquire(Count(1));
  IdleChild child;
  lease.set_holder(::getpid(), "run");
  lease.add_member(child.pid());
  const PoolStatus status = pool.status();
  ASSERT_TRUE(status.gpus[0].holder.has_value());
  EXPECT_EQ(status.gpus[0].holder->kind, "run");
  EXPECT_EQ(status.gpus[0].holder->member_pids, (std::vector<int>{child.pid()}));
}

TEST_F(GpuPoolTest, StatusShowsBusyForAForeignProcess) {
  IdleChild child;  // a live process that holds no lease
  GpuPool pool = PoolFromFile(R"({"gpus": [{}, {"processes": [{"pid": )" +
                              std::to_string(child.pid()) + R"(, "used_memory": "3G"}]}]})");
  const PoolStatus status = pool.status();
  ASSERT_EQ(status.gpus.size(), 2u);
  EXPECT_EQ(status.gpus[0].state, GpuState::kFree);
  const GpuStatus& busy = status.gpus[1];
  EXPECT_EQ(busy.state, GpuState::kBusy);
  EXPECT_STREQ(gpu_state_name(busy.state), "busy");
  EXPECT_FALSE(busy.holder.has_value());
  ASSERT_EQ(busy.processes.size(), 1u);
  EXPECT_EQ(busy.processes[0].pid, static_cast<unsigned>(child.pid()));
  EXPECT_EQ(busy.processes[0].used_memory_bytes, 3 * kGiB);
  EXPECT_EQ(busy.processes[0].user, user_name(::geteuid()));
  EXPECT_TRUE(busy.processes[0].foreign);
  EXPECT_EQ(busy.device.memory_used_bytes, 3 * kGiB);

  // And a request for it waits for the foreign process, unless sharing is allowed.
  ExpectError([&] { pool.acquire(Named({"1"})); }, ErrorCode::kTimedOut,
              "process " + std::to_string(child.pid()) + " outside gpulock");
  LeaseRequest sharing = Named({"1"});
  sharing.allow_foreign_processes = true;
  Lease shared = pool.acquire(sharing);
  EXPECT_EQ(pool.status().gpus[1].state, GpuState::kLeased);
}

TEST_F(GpuPoolTest, StatusTellsProcessesOfTheLeaseFromForeignOnes) {
  // This process holds the lease on GPU 0, and runs on it; pid 1 runs there too.
  GpuPool pool = PoolFromFile(R"({"gpus": [{"processes": [{"pid": )" + std::to_string(::getpid()) +
                              R"(}, {"pid": 1}]}]})");
  LeaseRequest request = Count(1);
  request.allow_foreign_processes = true;
  Lease lease = pool.acquire(request);
  const GpuStatus gpu = pool.status().gpus.at(0);
  EXPECT_EQ(gpu.state, GpuState::kLeased);
  ASSERT_EQ(gpu.processes.size(), 2u);
  EXPECT_FALSE(gpu.processes[0].foreign) << "the lease's own process counted as foreign";
  EXPECT_TRUE(gpu.processes[1].foreign);
  EXPECT_NE(gpu.note.find("outside the lease"), std::string::npos) << gpu.note;
}

TEST_F(GpuPoolTest, GarbageRecordInAHeldLockFileShowsLeasedWithoutHolder) {
  GpuPool pool = Pool(2);
  Lease lease = pool.acquire(Named({"0"}));
  std::string garbage = "\x1b[31m{\"schema\": 1, garbage";
  garbage.resize(kHolderRecordSize, '\xff');
  WriteRecordBytes(SimUuid(0), garbage);

  PoolStatus status;
  ASSERT_NO_THROW(status = pool.status());
  EXPECT_EQ(status.gpus[0].state, GpuState::kLeased) << "the lock, not the record, is the truth";
  EXPECT_FALSE(status.gpus[0].holder.has_value());
  EXPECT_NE(status.gpus[0].note.find("unavailable"), std::string::npos) << status.gpus[0].note;
  EXPECT_EQ(status.gpus[1].state, GpuState::kFree);
  // Writing through another descriptor did not end the lease.
  ExpectError([&] { pool.acquire(Named({"0"})); }, ErrorCode::kTimedOut, "details unavailable");
  ExpectError([&] { pool.release(lease.id()); }, ErrorCode::kNotFound);
}

TEST_F(GpuPoolTest, EmptyOrZeroedRecordShowsLeasedWithoutHolder) {
  GpuPool pool = Pool(1);
  Lease lease = pool.acquire(Count(1));
  ASSERT_EQ(::truncate(LockFile(SimUuid(0)).c_str(), 0), 0);
  EXPECT_FALSE(pool.status().gpus[0].holder.has_value());
  ASSERT_EQ(::truncate(LockFile(SimUuid(0)).c_str(), kHolderRecordSize), 0);  // all NULs
  const PoolStatus status = pool.status();
  EXPECT_EQ(status.gpus[0].state, GpuState::kLeased);
  EXPECT_FALSE(status.gpus[0].holder.has_value());
}

TEST_F(GpuPoolTest, RecordNotNamingTheGpuIsNotBelieved) {
  GpuPool pool = Pool(2);
  Lease lease = pool.acquire(Named({"0"}));
  HolderRecord forged;
  forged.lease_id = "fedcba9876543210";
  forged.user = "mallory";
  forged.holder = self_process_id();
  forged.gpus = {SimUuid(1)};  // some other GPU
  WriteRecordBytes(SimUuid(0), serialize_holder_record(forged));
  const PoolStatus status = pool.status();
  EXPECT_EQ(status.gpus[0].state, GpuState::kLeased);
  EXPECT_FALSE(status.gpus[0].holder.has_value());
  EXPECT_EQ(status.gpus[1].state, GpuState::kFree);
}

TEST_F(GpuPoolTest, RecordOfAFreeGpuIsIgnored) {
  GpuPool pool = Pool(1);
  { Lease lease = pool.acquire(Count(1)); }  // leaves its record behind
  const PoolStatus status = pool.status();
  EXPECT_EQ(status.gpus[0].state, GpuState::kFree);
  EXPECT_FALSE(status.gpus[0].holder.has_value());
}

TEST_F(GpuPoolTest, PlantedSymlinkExcludesOnlyThatGpu) {
  GpuPool pool = Pool(3);
  const fs::path target = temp_.path() / "precious";
  std::ofstream(target) << "precious";
  fs::create_symlink(target, LockFile(SimUuid(1)));

  const PoolStatus status = pool.status();
  EXPECT_EQ(status.gpus[0].state, GpuState::kFree);
  EXPECT_EQ(status.gpus[1].state, GpuState::kExcluded);
  EXPECT_NE(status.gpus[1].note.find("symbolic link"), std::string::npos) << status.gpus[1].note;
  EXPECT_EQ(status.gpus[2].state, GpuState::kFree);

  Lease lease = pool.acquire(Count(2));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{0, 2}));
  lease.release();
  ExpectError([&] { pool.acquire(Count(3)); }, ErrorCode::kUnsatisfiable, "symbolic link");
  ExpectError([&] { pool.acquire(Named({"1"})); }, ErrorCode::kUnsatisfiable, "symbolic link");
  std::ifstream in(target);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "precious");
}

TEST_F(GpuPoolTest, MigInstancesAreLeasedNotTheirParent) {
  GpuPool pool = PoolFromFile(R"({"gpus": [{"mig": [{"uuid": "MIG-aaaa"}, {"uuid": "MIG-bbbb"}]},
                                           {"uuid": "GPU-whole"}]})");
  ExpectError([&] { pool.acquire(Named({"0"})); }, ErrorCode::kUnsatisfiable, "MIG");
  Lease instance = pool.acquire(Named({"0:1"}));
  ASSERT_EQ(instance.gpus().size(), 1u);
  EXPECT_TRUE(instance.gpus()[0].is_mig_instance);
  EXPECT_EQ(instance.gpus()[0].display_index, "0:1");
  EXPECT_EQ(instance.cuda_visible_devices(), "MIG-bbbb");
  Lease two = pool.acquire(Count(2));
  EXPECT_EQ(two.uuid_list(), "MIG-aaaa,GPU-whole");
  ExpectError([&] { pool.acquire(Count(4)); }, ErrorCode::kUnsatisfiable);

  const PoolStatus status = pool.status();
  ASSERT_EQ(status.gpus.size(), 4u);
  EXPECT_EQ(status.gpus[0].state, GpuState::kExcluded);
  EXPECT_NE(status.gpus[0].note.find("MIG"), std::string::npos);
  EXPECT_EQ(status.gpus[1].state, GpuState::kLeased);
  EXPECT_EQ(status.gpus[2].state, GpuState::kLeased);
  EXPECT_EQ(status.gpus[3].state, GpuState::kLeased);
}

TEST_F(GpuPoolTest, ProhibitedComputeModeIsExcluded) {
  GpuPool pool = PoolFromFile(R"({"gpus": [{"compute_mode": "prohibited"}, {}]})");
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kExcluded);
  ExpectError([&] { pool.acquire(Named({"0"})); }, ErrorCode::kUnsatisfiable, "prohibited");
  ExpectError([&] { pool.acquire(Count(2)); }, ErrorCode::kUnsatisfiable);
  Lease lease = pool.acquire(Count(1));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{1}));
}

// --- release() ----------------------------------------------------------------------------

TEST_F(GpuPoolTest, ReleaseOfUnknownLeaseIsNotFound) {
  GpuPool pool = Pool(2);
  Lease lease = pool.acquire(Count(1));
  ExpectError([&] { pool.release("0123456789abcdef"); }, ErrorCode::kNotFound, "0123456789abcdef");
}

TEST_F(GpuPoolTest, ReleaseOfMalformedIdIsInvalid) {
  GpuPool pool = Pool(1);
  for (const char* id :
       {"", "xyz", "0123456789ABCDEF", "0123456789abcdef0", "../etc/passwd", "\x1b[2J0123456789ab"})
    ExpectError([&] { pool.release(id); }, ErrorCode::kInvalidArgument, "not a lease id");
}

TEST_F(GpuPoolTest, ReleaseOfAProcessLeaseIsInvalidAndKeepsIt) {
  GpuPool pool = Pool(1);
  Lease lease = pool.acquire(Count(1));
  ExpectError([&] { pool.release(lease.id()); }, ErrorCode::kInvalidArgument, "process");
  EXPECT_TRUE(lease.active());
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kLeased);
  lease.set_holder(::getpid(), "run");
  ExpectError([&] { pool.release(lease.id()); }, ErrorCode::kInvalidArgument, "command");
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kLeased);
}

TEST_F(GpuPoolTest, ReleaseNeverSignalsAProcessThatIsNotAGpulockHolder) {
  // A detached lease whose record names a process that does not hold the lease's lock files
  // (here, a child of the test forked before the lease existed): release must refuse rather
  // than kill it.
  IdleChild child;
  GpuPool pool = Pool(1);
  Lease lease = pool.acquire(Count(1));
  lease.set_holder(child.pid(), "detached");
  ASSERT_EQ(pool.status().gpus[0].holder.value().kind, "detached");
  ExpectError([&] { pool.release(lease.id()); }, ErrorCode::kInternal,
              "is not the process holding it");
  EXPECT_TRUE(child.running()) << "release() signalled an unrelated process";
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kLeased);
}

TEST_F(GpuPoolTest, ReleaseOfAnotherUsersLeaseIsDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root may release any lease";
  GpuPool pool = Pool(1);
  Lease lease = pool.acquire(Count(1));
  HolderRecord forged;
  forged.lease_id = "fedcba9876543210";
  forged.uid = ::geteuid() + 1;
  forged.user = "someone";
  forged.kind = HolderKind::kDetached;
  forged.holder = self_process_id();
  forged.gpus = {SimUuid(0)};
  WriteRecordBytes(SimUuid(0), serialize_holder_record(forged));
  ExpectError([&] { pool.release("fedcba9876543210"); }, ErrorCode::kPermissionDenied, "someone");
}

// --- CUDA_VISIBLE_DEVICES -----------------------------------------------------------------

TEST_F(GpuPoolTest, CudaVisibleDevicesLimitsCandidates) {
  GpuPool pool = Pool(4);
  LeaseRequest request = Count(1);
  request.cuda_visible_devices = "2,3";
  Lease first = pool.acquire(request);
  EXPECT_EQ(Indices(first), (std::vector<unsigned>{2}));
  Lease second = pool.acquire(request);
  EXPECT_EQ(Indices(second), (std::vector<unsigned>{3}));
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kTimedOut);
  request.count = 3;
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kUnsatisfiable, "CUDA_VISIBLE_DEVICES");
}

TEST_F(GpuPoolTest, CudaVisibleDevicesByUuidAndWithAnInvalidEntry) {
  GpuPool pool = Pool(4);
  LeaseRequest request = Count(1);
  request.cuda_visible_devices = SimUuid(3);
  EXPECT_EQ(Indices(pool.acquire(request)), (std::vector<unsigned>{3}));
  request.cuda_visible_devices = "1,bogus,2";  // CUDA stops at "bogus"
  request.count = 2;
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kUnsatisfiable);
  request.count = 1;
  EXPECT_EQ(Indices(pool.acquire(request)), (std::vector<unsigned>{1}));
}

TEST_F(GpuPoolTest, EmptyCudaVisibleDevicesHidesEverything) {
  GpuPool pool = Pool(2);
  LeaseRequest request = Count(1);
  request.cuda_visible_devices = "";
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kUnsatisfiable);
}

TEST_F(GpuPoolTest, ExplicitGpuOutsideCudaVisibleDevicesIsUnsatisfiable) {
  GpuPool pool = Pool(2);
  LeaseRequest request = Named({"0"});
  request.cuda_visible_devices = "1";
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kUnsatisfiable, "CUDA_VISIBLE_DEVICES");
}

// --- health filters -----------------------------------------------------------------------

class HealthTest : public GpuPoolTest {
 protected:
  // 0: 10 GiB free; 1: 90 % busy; 2: drawing 500 W; 3: a foreign process; 4: idle.
  GpuPool Machine() {
    return PoolFromFile(R"({"gpus": [
      {"memory_used": "70G"}, {"utilization": 90}, {"power_draw": 500},
      {"processes": [{"pid": 4194304}]}, {}]})");
  }
  static LeaseRequest Healthy(unsigned count) {
    LeaseRequest request = Count(count);
    request.min_free_memory_bytes = 20 * kGiB;
    request.max_utilization_percent = 50;
    request.max_power_watts = 300;
    return request;
  }
};

TEST_F(HealthTest, EachFilterOnItsOwn) {
  GpuPool pool = Machine();
  LeaseRequest memory = Named({"0"});
  memory.min_free_memory_bytes = 20 * kGiB;
  ExpectError([&] { pool.acquire(memory); }, ErrorCode::kTimedOut, "10.0 GiB free");
  LeaseRequest busy = Named({"1"});
  busy.max_utilization_percent = 50;
  ExpectError([&] { pool.acquire(busy); }, ErrorCode::kTimedOut, "90% busy");
  LeaseRequest power = Named({"2"});
  power.max_power_watts = 300;
  ExpectError([&] { pool.acquire(power); }, ErrorCode::kTimedOut, "500 W");
  ExpectError([&] { pool.acquire(Named({"3"})); }, ErrorCode::kTimedOut, "process 4194304");
  // Without the filter each is fine (GPU 3 only when sharing is allowed).
  for (const char* name : {"0", "1", "2"}) EXPECT_TRUE(pool.acquire(Named({name})).active());
}

TEST_F(HealthTest, OnlyTheHealthyGpuQualifies) {
  GpuPool pool = Machine();
  Lease lease = pool.acquire(Healthy(1));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{4}));
  lease.release();
  try {
    pool.acquire(Healthy(2));
    ADD_FAILURE() << "two healthy GPUs found";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kTimedOut);
    const std::string message = error.what();
    for (const char* reason : {"GPU 0", "GPU 1", "GPU 2", "GPU 3"})
      EXPECT_NE(message.find(reason), std::string::npos) << reason << " in " << message;
  }
}

TEST_F(HealthTest, AllowForeignProcesses) {
  GpuPool pool = Machine();
  LeaseRequest request = Healthy(2);
  request.allow_foreign_processes = true;
  Lease lease = pool.acquire(request);
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{3, 4}));
}

TEST_F(HealthTest, ThresholdsAreInclusive) {
  GpuPool pool =
      PoolFromFile(R"({"gpus": [{"memory_used": "60G", "utilization": 50, "power_draw": 300}]})");
  Lease lease = pool.acquire(Healthy(1));
  EXPECT_TRUE(lease.active());
}

TEST_F(HealthTest, MoreMemoryThanAnyGpuHasIsUnsatisfiable) {
  GpuPool pool = Machine();
  LeaseRequest request = Count(1);
  request.min_free_memory_bytes = 100 * kGiB;
  ExpectError([&] { pool.acquire(Waiting(request)); }, ErrorCode::kUnsatisfiable, "in total");
}

TEST_F(HealthTest, UnknownReadingFailsTheFilter) {
  // MIG instances report no utilisation or power: a filter on them cannot pass.
  GpuPool pool = PoolFromFile(R"({"gpus": [{"mig": [{}]}]})");
  LeaseRequest request = Named({"0:0"});
  request.max_utilization_percent = 100;
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kTimedOut, "unknown");
  request.max_utilization_percent.reset();
  request.max_power_watts = 1e6;
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kTimedOut, "unknown");
  request.max_power_watts.reset();
  EXPECT_TRUE(pool.acquire(request).active());
}

TEST_F(HealthTest, WaitingOnHealthIsServedWhenReadingsChange) {
  PoolOptions options = Options();
  options.health_recheck_interval = milliseconds(10);
  GpuPool pool = PoolFromFile(R"({"gpus": [{"utilization": 90}]})", options);
  LeaseRequest request = Waiting(Count(1));
  request.max_utilization_percent = 50;
  std::string reason;
  WaitHooks hooks;
  hooks.on_progress = [&](const WaitProgress& progress) {
    if (reason.empty() && !progress.blocking.empty()) reason = progress.blocking[0].reason;
  };
  BackgroundAcquire waiter(pool, request, hooks);
  waiter.WaitUntilWaiting();
  WriteGpus(R"({"gpus": [{"utilization": 10}]})");
  std::optional<Lease>& got = waiter.Finish();
  ASSERT_TRUE(got.has_value()) << Describe(waiter.failure());
  EXPECT_EQ(Indices(*got), (std::vector<unsigned>{0}));
  EXPECT_NE(reason.find("90% busy"), std::string::npos) << reason;
}

// A DeviceSource whose devices the test sets directly: for readings no simulated file can
// leave out (unknown free memory, a process list the driver would not give).
class FixedSource final : public DeviceSource {
 public:
  explicit FixedSource(std::vector<Device> devices) : devices_(std::move(devices)) {}
  std::vector<Device> devices() override { return devices_; }
  int distance(const std::string&, const std::string&) override { return 50; }
  std::string description() const override { return "fixed test devices"; }
  bool simulated() const override { return true; }

 private:
  std::vector<Device> devices_;
};

TEST_F(HealthTest, UnknownFreeMemoryAndUnlistableProcessesFailTheirChecks) {
  Device no_memory;
  no_memory.index = 0;
  no_memory.uuid = "GPU-no-memory-reading";
  Device no_processes;
  no_processes.index = 1;
  no_processes.uuid = "GPU-no-process-list";
  no_processes.processes_known = false;
  GpuPool pool(std::make_unique<FixedSource>(std::vector<Device>{no_memory, no_processes}),
               Options());

  LeaseRequest memory = Named({"0"});
  memory.min_free_memory_bytes = kGiB;
  ExpectError([&] { pool.acquire(memory); }, ErrorCode::kTimedOut, "free memory unknown");
  memory.min_free_memory_bytes.reset();
  EXPECT_TRUE(pool.acquire(memory).active()) << "without the filter, no reading is needed";

  ExpectError([&] { pool.acquire(Named({"1"})); }, ErrorCode::kTimedOut, "cannot be listed");
  LeaseRequest sharing = Named({"1"});
  sharing.allow_foreign_processes = true;
  EXPECT_TRUE(pool.acquire(sharing).active());
}

// --- the pool itself ----------------------------------------------------------------------

TEST_F(GpuPoolTest, PoolCreatesItsLockDirectoryAndReportsIt) {
  GpuPool pool = Pool(2);
  EXPECT_EQ(pool.lock_dir(), lock_dir_);
  EXPECT_TRUE(fs::is_directory(lock_dir_));
  EXPECT_TRUE(pool.warnings().empty());
  EXPECT_TRUE(pool.device_source().simulated());
  EXPECT_EQ(pool.devices().size(), 2u);
}

TEST_F(GpuPoolTest, UnusableLockDirectoryIsAnEnvironmentError) {
  std::ofstream(lock_dir_) << "a file";
  ExpectError([&] { Pool(1); }, ErrorCode::kEnvironment);
}

TEST_F(GpuPoolTest, MovedPoolKeepsWorking) {
  GpuPool first = Pool(2);
  Lease a = first.acquire(Count(1));
  GpuPool moved(std::move(first));
  Lease b = moved.acquire(Count(1));
  EXPECT_EQ(Indices(b), (std::vector<unsigned>{1}));
  GpuPool assigned = Pool(1);
  assigned = std::move(moved);
  ExpectError([&] { assigned.acquire(Count(1)); }, ErrorCode::kTimedOut);
}

}  // namespace
}  // namespace gpulock
