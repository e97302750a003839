// The promises of GpuPool (include/gpulock/gpu_pool.hpp) that every backend keeps, checked on
// each: the local lock files and a real Redis server (started once for the suite, on a free
// loopback port; each test has a pool of its own). Acquiring all-or-nothing, exclusion, waiting
// and being woken, status, release by id, CUDA_VISIBLE_DEVICES and health filters, on simulated
// GPUs. Where a backend shows a promise differently (descriptors, the host's name), the fixture
// says what each shows. No test depends on how fast anything happens: waits are ended by events
// (a release, a changed file, an interrupt hook), and timeouts are only hang guards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "gpu_pool_test_support.h"
#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"
#include "process/process_identity.h"
#include "redis_test_server.h"
#include "temp_dir.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using namespace test_support;

enum class Backend { kLocal, kRedis };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kLocal ? "Local" : "Redis";
}

// The name this machine registers as on Redis.
constexpr const char* kRedisHost = "contract-host";

class GpuPoolContractTest : public ::testing::TestWithParam<Backend> {
 protected:
  // One server for the whole suite: starting one per test would cost more than the tests.
  static void SetUpTestSuite() { server_ = new RedisTestServer(); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  bool redis() const { return GetParam() == Backend::kRedis; }

  PoolOptions Options() const {
    PoolOptions options;
    if (redis()) {
      options.backend = server_->url();
      options.pool_name = pool_name_;
      options.host_name = kRedisHost;
      options.lease_ttl = std::chrono::seconds(30);
      options.config = Config{};
    } else {
      options.lock_dir = lock_dir_;
    }
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

  // What each backend shows: a local lease is its lock descriptors, one per GPU (a Redis lease
  // has none); the host GPUs and holders are registered under; the lock directory (none on
  // Redis).
  std::size_t LockFds(std::size_t gpus) const { return redis() ? 0 : gpus; }
  std::string ThisHost() const { return redis() ? kRedisHost : host_name(); }
  std::string ExpectedLockDir() const { return redis() ? "" : lock_dir_.string(); }

  static RedisTestServer* server_;
  TempDir temp_{"contract"};
  fs::path lock_dir_ = temp_.path() / "locks";
  fs::path gpus_file_ = temp_.path() / "gpus.json";
  std::string pool_name_ = "contract-" + make_lease_id();  // a pool of this test's own
};

RedisTestServer* GpuPoolContractTest::server_ = nullptr;

INSTANTIATE_TEST_SUITE_P(Backends, GpuPoolContractTest,
                         ::testing::Values(Backend::kLocal, Backend::kRedis), BackendName);

// --- acquiring, releasing, exclusion, refusals, waiting, status, release(), visibility ------

TEST_P(GpuPoolContractTest, AcquireOneGpu) {
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
  EXPECT_EQ(lease.lock_fds().size(), LockFds(1));
  EXPECT_NE(lease.started_at(), std::chrono::system_clock::time_point{});
  // Fencing tokens are the Redis backend's; the local backend's is 0 (include/gpulock/lease.hpp).
  if (redis())
    EXPECT_GT(lease.fencing_token(), 0u);
  else
    EXPECT_EQ(lease.fencing_token(), 0u);
  EXPECT_FALSE(lease.lost());
}

TEST_P(GpuPoolContractTest, AcquireTwoGpus) {
  GpuPool pool = Pool(4);
  Lease lease = pool.acquire(Count(2));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{0, 1}));
  EXPECT_EQ(lease.uuid_list(), SimUuid(0) + "," + SimUuid(1));
  EXPECT_EQ(lease.cuda_visible_devices(), "0,1");
  EXPECT_EQ(lease.cuda_visible_devices(VisibleFormat::kUuid), SimUuid(0) + "," + SimUuid(1));
  EXPECT_EQ(lease.lock_fds().size(), LockFds(2));
}

TEST_P(GpuPoolContractTest, LeasesTakeDistinctGpusAndHaveDistinctIds) {
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

TEST_P(GpuPoolContractTest, ExplicitGpusByIndexUuidAndPrefix) {
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

TEST_P(GpuPoolContractTest, ExplicitGpusKeepTheRequestedOrder) {
  GpuPool pool = Pool(4);
  Lease lease = pool.acquire(Named({"3", "1"}));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{3, 1}));
  EXPECT_EQ(lease.cuda_visible_devices(), "3,1");
}

TEST_P(GpuPoolContractTest, PrefersGpusOnTheSameSwitch) {
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
TEST_P(GpuPoolContractTest, ConcurrentStatusOnAFileBackedPool) {
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

TEST_P(GpuPoolContractTest, ConcurrentAcquiresInOnePoolGetDistinctGpus) {
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

TEST_P(GpuPoolContractTest, ReleasedOnDestruction) {
  GpuPool pool = Pool(1);
  {
    Lease lease = pool.acquire(Count(1));
    ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut);
  }
  Lease again = pool.acquire(Count(1));
  EXPECT_EQ(Indices(again), (std::vector<unsigned>{0}));
}

TEST_P(GpuPoolContractTest, ReleasedOnMoveAssignment) {
  GpuPool pool = Pool(2);
  Lease lease = pool.acquire(Count(1));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{0}));
  lease = pool.acquire(Count(1));  // GPU 0 is still held while the new lease is taken
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{1}));
  const PoolStatus status = pool.status();
  EXPECT_EQ(status.gpus[0].state, GpuState::kFree) << "the overwritten lease was not released";
  EXPECT_EQ(status.gpus[1].state, GpuState::kLeased);
}

TEST_P(GpuPoolContractTest, MoveTransfersTheLease) {
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

TEST_P(GpuPoolContractTest, ExplicitReleaseIsIdempotent) {
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

TEST_P(GpuPoolContractTest, TwoPoolsInOneProcessExcludeEachOther) {
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

TEST_P(GpuPoolContractTest, AllOrNothing) {
  GpuPool pool = Pool(2);
  Lease held = pool.acquire(Named({"1"}));
  ExpectError([&] { pool.acquire(Named({"0", "1"})); }, ErrorCode::kTimedOut, "not free");
  ExpectError([&] { pool.acquire(Count(2)); }, ErrorCode::kTimedOut);
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kFree) << "a failed request kept GPU 0";
  Lease zero = pool.acquire(Named({"0"}));
  EXPECT_TRUE(zero.active());
}

TEST_P(GpuPoolContractTest, MoreGpusThanExistIsUnsatisfiable) {
  GpuPool pool = Pool(4);
  ExpectError([&] { pool.acquire(Waiting(Count(5))); }, ErrorCode::kUnsatisfiable, "5 GPUs");
  ExpectError([&] { pool.acquire(Waiting(Count(100000))); }, ErrorCode::kUnsatisfiable);
}

TEST_P(GpuPoolContractTest, CountZeroIsInvalid) {
  GpuPool pool = Pool(4);
  ExpectError([&] { pool.acquire(Count(0)); }, ErrorCode::kInvalidArgument);
}

TEST_P(GpuPoolContractTest, NegativeTimeoutIsInvalid) {
  GpuPool pool = Pool(1);
  LeaseRequest request = Waiting(Count(1));
  request.timeout = milliseconds(-1);
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kInvalidArgument, "timeout");
}

TEST_P(GpuPoolContractTest, HealthLimitsOutOfRangeAreInvalid) {
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

TEST_P(GpuPoolContractTest, UnknownGpuIsUnsatisfiable) {
  GpuPool pool = Pool(2);
  ExpectError([&] { pool.acquire(Waiting(Named({"7"}))); }, ErrorCode::kUnsatisfiable, "'7'");
  ExpectError([&] { pool.acquire(Named({"GPU-ffff"})); }, ErrorCode::kUnsatisfiable, "GPU-ffff");
  ExpectError([&] { pool.acquire(Named({"0:1"})); }, ErrorCode::kUnsatisfiable);
  ExpectError([&] { pool.acquire(Named({"0", "9"})); }, ErrorCode::kUnsatisfiable);
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kFree);
}

TEST_P(GpuPoolContractTest, AmbiguousUuidPrefixIsInvalid) {
  GpuPool pool = Pool(2);
  ExpectError([&] { pool.acquire(Named({"GPU-5e1f"})); }, ErrorCode::kInvalidArgument,
              "several GPUs");
}

TEST_P(GpuPoolContractTest, DuplicateGpuIsInvalid) {
  GpuPool pool = Pool(2);
  ExpectError([&] { pool.acquire(Named({"0", "0"})); }, ErrorCode::kInvalidArgument, "twice");
  ExpectError(
      [&] {
        pool.acquire(Named({"1", SimUuid(1)}));
      },
      ErrorCode::kInvalidArgument, "twice");
}

TEST_P(GpuPoolContractTest, HostileGpuNamesAreShownSafely) {
  GpuPool pool = Pool(1);
  try {
    pool.acquire(Named({"\x1b[2J\x1b]0;x\x07"}));
    ADD_FAILURE() << "accepted";
  } catch (const Error& error) {
    EXPECT_EQ(std::string(error.what()).find('\x1b'), std::string::npos) << error.what();
  }
}

TEST_P(GpuPoolContractTest, TimeoutIsTimedOut) {
  GpuPool pool = Pool(1);
  Lease held = pool.acquire(Count(1));
  LeaseRequest request = Count(1);
  request.wait = true;
  request.timeout = milliseconds(20);
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kTimedOut, "within the timeout");
  request.timeout = milliseconds(0);
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kTimedOut, held.id());
}

TEST_P(GpuPoolContractTest, NoWaitFailsAtOnceNamingTheHolder) {
  GpuPool pool = Pool(1);
  LeaseRequest holding = Count(1);
  holding.label = "sweep";
  Lease held = pool.acquire(holding);
  ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut, "GPU 0: leased by");
  ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut, "'sweep'");
}

TEST_P(GpuPoolContractTest, WaitingAcquireInAnotherThreadIsServedAfterRelease) {
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

TEST_P(GpuPoolContractTest, WaitingAcquireInAnotherPoolIsServedAfterRelease) {
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

TEST_P(GpuPoolContractTest, ProgressNamesTheHolder) {
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

TEST_P(GpuPoolContractTest, InterruptedStopsTheWait) {
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
TEST_P(GpuPoolContractTest, HugeTimeoutWaits) {
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

TEST_P(GpuPoolContractTest, StatusShowsFreeAndLeasedWithHolder) {
  GpuPool pool = Pool(3);
  LeaseRequest request = Named({"1"});
  request.label = "nightly eval";
  request.command = "python eval.py --all";
  Lease lease = pool.acquire(request);

  const PoolStatus status = pool.status();
  EXPECT_TRUE(status.simulated);
  EXPECT_EQ(status.lock_dir, ExpectedLockDir());
  EXPECT_EQ(status.host, ThisHost());
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
  EXPECT_EQ(holder.host, ThisHost());
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

TEST_P(GpuPoolContractTest, StatusShowsHowTheLeaseIsHeldAndItsMembers) {
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

TEST_P(GpuPoolContractTest, StatusShowsBusyForAForeignProcess) {
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

TEST_P(GpuPoolContractTest, StatusTellsProcessesOfTheLeaseFromForeignOnes) {
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

TEST_P(GpuPoolContractTest, RecordOfAFreeGpuIsIgnored) {
  GpuPool pool = Pool(1);
  { Lease lease = pool.acquire(Count(1)); }  // leaves its record behind
  const PoolStatus status = pool.status();
  EXPECT_EQ(status.gpus[0].state, GpuState::kFree);
  EXPECT_FALSE(status.gpus[0].holder.has_value());
}

TEST_P(GpuPoolContractTest, MigInstancesAreLeasedNotTheirParent) {
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

TEST_P(GpuPoolContractTest, ProhibitedComputeModeIsExcluded) {
  GpuPool pool = PoolFromFile(R"({"gpus": [{"compute_mode": "prohibited"}, {}]})");
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kExcluded);
  ExpectError([&] { pool.acquire(Named({"0"})); }, ErrorCode::kUnsatisfiable, "prohibited");
  ExpectError([&] { pool.acquire(Count(2)); }, ErrorCode::kUnsatisfiable);
  Lease lease = pool.acquire(Count(1));
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{1}));
}

TEST_P(GpuPoolContractTest, ReleaseOfUnknownLeaseIsNotFound) {
  GpuPool pool = Pool(2);
  Lease lease = pool.acquire(Count(1));
  ExpectError([&] { pool.release("0123456789abcdef"); }, ErrorCode::kNotFound, "0123456789abcdef");
}

TEST_P(GpuPoolContractTest, ReleaseOfMalformedIdIsInvalid) {
  GpuPool pool = Pool(1);
  for (const char* id :
       {"", "xyz", "0123456789ABCDEF", "0123456789abcdef0", "../etc/passwd", "\x1b[2J0123456789ab"})
    ExpectError([&] { pool.release(id); }, ErrorCode::kInvalidArgument, "not a lease id");
}

TEST_P(GpuPoolContractTest, ReleaseOfAProcessLeaseIsRefusedAndKeepsIt) {
  GpuPool pool = Pool(1);
  Lease lease = pool.acquire(Count(1));
  ExpectError([&] { pool.release(lease.id()); }, ErrorCode::kUnsatisfiable, "process");
  EXPECT_TRUE(lease.active());
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kLeased);
  lease.set_holder(::getpid(), "run");
  ExpectError([&] { pool.release(lease.id()); }, ErrorCode::kUnsatisfiable, "gpulock run");
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kLeased);
}

TEST_P(GpuPoolContractTest, CudaVisibleDevicesLimitsCandidates) {
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

TEST_P(GpuPoolContractTest, CudaVisibleDevicesByUuidAndWithAnInvalidEntry) {
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

TEST_P(GpuPoolContractTest, EmptyCudaVisibleDevicesHidesEverything) {
  GpuPool pool = Pool(2);
  LeaseRequest request = Count(1);
  request.cuda_visible_devices = "";
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kUnsatisfiable);
}

TEST_P(GpuPoolContractTest, ExplicitGpuOutsideCudaVisibleDevicesIsUnsatisfiable) {
  GpuPool pool = Pool(2);
  LeaseRequest request = Named({"0"});
  request.cuda_visible_devices = "1";
  ExpectError([&] { pool.acquire(request); }, ErrorCode::kUnsatisfiable, "CUDA_VISIBLE_DEVICES");
}

TEST_P(GpuPoolContractTest, VerifyConfirmsAHeldLeaseAndItsToken) {
  GpuPool pool = Pool(2);
  Lease lease = pool.acquire(Count(2));
  EXPECT_EQ(lease.verify(), lease.fencing_token());
  EXPECT_FALSE(lease.lost());
  lease.release();
  ExpectError([&] { lease.verify(); }, ErrorCode::kInvalidArgument, "released");
}

TEST_P(GpuPoolContractTest, PoolReportsItsBackendAndDevices) {
  GpuPool pool = Pool(2);
  EXPECT_EQ(pool.backend_name(), redis() ? "redis" : "file");
  EXPECT_EQ(pool.lock_dir(), redis() ? fs::path() : lock_dir_);  // empty on Redis
  EXPECT_TRUE(pool.warnings().empty());
  EXPECT_TRUE(pool.device_source().simulated());
  EXPECT_EQ(pool.devices().size(), 2u);
}

TEST_P(GpuPoolContractTest, MovedPoolKeepsWorking) {
  GpuPool first = Pool(2);
  Lease a = first.acquire(Count(1));
  GpuPool moved(std::move(first));
  Lease b = moved.acquire(Count(1));
  EXPECT_EQ(Indices(b), (std::vector<unsigned>{1}));
  GpuPool assigned = Pool(1);
  assigned = std::move(moved);
  ExpectError([&] { assigned.acquire(Count(1)); }, ErrorCode::kTimedOut);
}

// --- shared leases (several jobs per GPU by memory) ----------------------------------------
// Simulated GPUs have 80 GiB each. What a GPU carries is read back from status() and checked
// against the leases the test holds.

LeaseRequest Shared(std::uint64_t gib, unsigned count = 1) {
  LeaseRequest request = Count(count);
  request.memory_bytes = gib * kGiB;
  return request;
}

// The shared use of GPU `index` in a status, or nullopt when no shared lease holds it.
std::optional<SharedUse> SharedOn(const PoolStatus& status, unsigned index) {
  for (const auto& gpu : status.gpus)
    if (gpu.device.index == index) return gpu.shared;
  return std::nullopt;
}

TEST_P(GpuPoolContractTest, SharedLeasesCoexistUpToTheGpusMemory) {
  GpuPool pool = Pool(1);
  Lease a = pool.acquire(Shared(30));
  Lease b = pool.acquire(Shared(30));
  EXPECT_NE(a.id(), b.id());
  EXPECT_EQ(a.memory_bytes(), 30 * kGiB);
  EXPECT_EQ(Indices(a), (std::vector<unsigned>{0}));
  EXPECT_EQ(Indices(b), (std::vector<unsigned>{0}));
  if (redis()) {
    EXPECT_NE(a.fencing_token(), b.fencing_token());
  }
  ExpectError([&] { pool.acquire(Shared(21)); }, ErrorCode::kTimedOut, "memory");
  Lease c = pool.acquire(Shared(20));  // exactly the rest
  const auto shared = SharedOn(pool.status(), 0);
  ASSERT_TRUE(shared.has_value());
  EXPECT_EQ(shared->jobs, 3u);
  EXPECT_EQ(shared->reserved_bytes, 80 * kGiB);
  std::set<std::string> ids;
  for (const auto& h : shared->leases) ids.insert(h.lease_id);
  EXPECT_EQ(ids, (std::set<std::string>{a.id(), b.id(), c.id()}));
  ExpectError([&] { pool.acquire(Shared(1)); }, ErrorCode::kTimedOut);
}

TEST_P(GpuPoolContractTest, ExclusiveAndSharedLeasesExcludeEachOther) {
  GpuPool pool = Pool(1);
  std::optional<Lease> exclusive(pool.acquire(Count(1)));
  ExpectError([&] { pool.acquire(Shared(1)); }, ErrorCode::kTimedOut);
  exclusive.reset();
  std::optional<Lease> shared(pool.acquire(Shared(1)));
  ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut);
  const PoolStatus status = pool.status();
  ASSERT_EQ(status.gpus.size(), 1u);
  EXPECT_EQ(status.gpus[0].state, GpuState::kLeased);
  EXPECT_FALSE(status.gpus[0].holder.has_value());
  shared.reset();
  Lease whole = pool.acquire(Count(1));
  EXPECT_FALSE(SharedOn(pool.status(), 0).has_value());
}

TEST_P(GpuPoolContractTest, ReleasingASharedLeaseFreesExactlyItsMemory) {
  GpuPool pool = Pool(1);
  std::optional<Lease> a(pool.acquire(Shared(40)));
  Lease b = pool.acquire(Shared(30));
  ExpectError([&] { pool.acquire(Shared(11)); }, ErrorCode::kTimedOut);
  a.reset();
  ExpectError([&] { pool.acquire(Shared(51)); }, ErrorCode::kTimedOut);
  Lease c = pool.acquire(Shared(50));
  const auto shared = SharedOn(pool.status(), 0);
  ASSERT_TRUE(shared.has_value());
  EXPECT_EQ(shared->jobs, 2u);
  EXPECT_EQ(shared->reserved_bytes, 80 * kGiB);
}

TEST_P(GpuPoolContractTest, SharedLeasesOnSeveralGpusAreAllOrNothing) {
  GpuPool pool = Pool(3);
  Lease whole = pool.acquire(Named({"1"}));
  ExpectError([&] { pool.acquire(Shared(10, 3)); }, ErrorCode::kTimedOut);
  LeaseRequest named = Shared(10);
  named.gpus = {"0", "1", "2"};
  ExpectError([&] { pool.acquire(named); }, ErrorCode::kTimedOut);
  EXPECT_FALSE(SharedOn(pool.status(), 0).has_value());  // nothing was left on GPU 0 or 2
  EXPECT_FALSE(SharedOn(pool.status(), 2).has_value());
  Lease two = pool.acquire(Shared(10, 2));
  EXPECT_EQ(Indices(two), (std::vector<unsigned>{0, 2}));
  EXPECT_EQ(SharedOn(pool.status(), 2)->jobs, 1u);
}

TEST_P(GpuPoolContractTest, SharedLeasesRespectTheJobCapAndSlots) {
  PoolOptions options = Options();
  Config config;
  config.max_jobs_per_gpu = 2;
  options.config = config;
  {
    GpuPool capped(make_simulated_source(1), options);
    Lease a = capped.acquire(Shared(1));
    Lease b = capped.acquire(Shared(1));
    ExpectError([&] { capped.acquire(Shared(1)); }, ErrorCode::kTimedOut);
  }
  GpuPool slotted = Pool(1);
  LeaseRequest quarter = Count(1);
  quarter.slots = 4;
  std::vector<Lease> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(slotted.acquire(quarter));
  EXPECT_EQ(quarters[0].memory_bytes(), 20 * kGiB);
  ExpectError([&] { slotted.acquire(quarter); }, ErrorCode::kTimedOut);
}

TEST_P(GpuPoolContractTest, SharedLeasesPackByDefaultAndSpreadOnRequest) {
  GpuPool pool = Pool(2);
  Lease a = pool.acquire(Shared(10));
  Lease b = pool.acquire(Shared(10));
  EXPECT_EQ(Indices(b), Indices(a));  // the partly used GPU first
  LeaseRequest spread = Shared(10);
  spread.spread = true;
  Lease c = pool.acquire(spread);
  EXPECT_NE(Indices(c), Indices(a));  // the emptiest
}

TEST_P(GpuPoolContractTest, MemoryUsedOutsideGpulockAndTheReserveCount) {
  PoolOptions options = Options();
  Config config;
  config.shared_memory_reserve_bytes = 10 * kGiB;
  options.config = config;
  GpuPool pool = PoolFromFile(R"({"gpus": [{"processes": [{"pid": 4194304,
                                            "used_memory": "20G"}]}]})",
                              options);
  ExpectError([&] { pool.acquire(Shared(51)); }, ErrorCode::kTimedOut);
  Lease fits = pool.acquire(Shared(50));
  ExpectError([&] { pool.acquire(Shared(81)); }, ErrorCode::kUnsatisfiable);
}

TEST_P(GpuPoolContractTest, WaitingSharedRequestIsServedWhenMemoryFrees) {
  GpuPool pool = Pool(1);
  std::optional<Lease> held(pool.acquire(Shared(60)));
  LeaseRequest request = Waiting(Shared(40));
  BackgroundAcquire waiter(pool, request);
  waiter.WaitUntilWaiting();
  held.reset();
  std::optional<Lease>& got = waiter.Finish();
  ASSERT_TRUE(got.has_value()) << Describe(waiter.failure());
  EXPECT_EQ(got->memory_bytes(), 40 * kGiB);
}

// --- health filters -----------------------------------------------------------------------

class HealthContractTest : public GpuPoolContractTest {
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

INSTANTIATE_TEST_SUITE_P(Backends, HealthContractTest,
                         ::testing::Values(Backend::kLocal, Backend::kRedis), BackendName);

TEST_P(HealthContractTest, EachFilterOnItsOwn) {
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

TEST_P(HealthContractTest, OnlyTheHealthyGpuQualifies) {
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

TEST_P(HealthContractTest, AllowForeignProcesses) {
  GpuPool pool = Machine();
  LeaseRequest request = Healthy(2);
  request.allow_foreign_processes = true;
  Lease lease = pool.acquire(request);
  EXPECT_EQ(Indices(lease), (std::vector<unsigned>{3, 4}));
}

TEST_P(HealthContractTest, ThresholdsAreInclusive) {
  GpuPool pool =
      PoolFromFile(R"({"gpus": [{"memory_used": "60G", "utilization": 50, "power_draw": 300}]})");
  Lease lease = pool.acquire(Healthy(1));
  EXPECT_TRUE(lease.active());
}

TEST_P(HealthContractTest, MoreMemoryThanAnyGpuHasIsUnsatisfiable) {
  GpuPool pool = Machine();
  LeaseRequest request = Count(1);
  request.min_free_memory_bytes = 100 * kGiB;
  ExpectError([&] { pool.acquire(Waiting(request)); }, ErrorCode::kUnsatisfiable, "in total");
}

TEST_P(HealthContractTest, UnknownReadingFailsTheFilter) {
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

TEST_P(HealthContractTest, WaitingOnHealthIsServedWhenReadingsChange) {
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

TEST_P(HealthContractTest, UnknownFreeMemoryAndUnlistableProcessesFailTheirChecks) {
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

}  // namespace
}  // namespace gpulock
