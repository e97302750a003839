// GpuPool (include/gpulock/gpu_pool.hpp) on the local backend only: what only lock files can
// show (a lock taken outside the protocol, records written into the files by others, planted
// symlinks, the lock directory) and release() of detached holders by signalling processes here.
// The promises every backend keeps are in gpu_pool_contract_test.cc. No test depends on how
// fast anything happens: waits are ended by events, and timeouts are only hang guards.
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
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "backend/holder_record.h"
#include "expect_error.h"
#include "gpu_pool_test_support.h"
#include "gpulock/error.hpp"
#include "inotify_instances.h"
#include "local/gpu_lock_file.h"
#include "local/lock_directory.h"
#include "process/process_identity.h"
#include "temp_dir.h"
#include "util/fd.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

using namespace test_support;

class GpuPoolTest : public ::testing::Test {
 protected:
  PoolOptions Options() const {
    PoolOptions options;
    options.lock_dir = lock_dir_;
    return options;
  }

  GpuPool Pool(unsigned count) { return GpuPool(make_simulated_source(count), Options()); }

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
};

// --- acquiring ----------------------------------------------------------------------------

// --- releasing ----------------------------------------------------------------------------

// --- exclusion ----------------------------------------------------------------------------

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

// --- waiting ------------------------------------------------------------------------------

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

// --- status -------------------------------------------------------------------------------

// Only waiters that follow releases hold an inotify instance (a user has 128 by default, for
// all their programs). Waiters served, with their pools still open, hold none: the pool kept
// each one for reuse before, so a pool of worker processes, each served once as a dispatcher,
// held all 128, and every later dispatcher's inotify_init1 stalled for a kernel grace period,
// failed, and fell back to polling.
TEST_F(GpuPoolTest, WaitersServedHoldNoInotifyInstance) {
  // None held, once the closes of earlier tests' instances (in the background) are done.
  ASSERT_TRUE(InotifyInstancesFallTo(0)) << InotifyInstances() << " held";
  GpuPool pool = Pool(1);
  Lease holder = pool.acquire(Count(1));
  // Three waiters, the three dispatchers, each through a pool of its own.
  std::vector<std::unique_ptr<GpuPool>> pools;
  std::vector<std::unique_ptr<BackgroundAcquire>> waiters;
  for (int i = 0; i < 3; ++i) {
    pools.push_back(std::make_unique<GpuPool>(Pool(1)));
    waiters.push_back(std::make_unique<BackgroundAcquire>(*pools.back(), Waiting(Count(1))));
    waiters.back()->WaitUntilWaiting();
  }
  EXPECT_GE(InotifyInstances(), 1) << "the oldest waiter follows releases";
  holder.release();
  for (auto& waiter : waiters) {
    std::optional<Lease>& got = waiter->Finish();
    ASSERT_TRUE(got) << Describe(waiter->failure());
    got->release();
  }
  EXPECT_TRUE(InotifyInstancesFallTo(0)) << InotifyInstances() << " held";
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

// --- release() ----------------------------------------------------------------------------

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

}  // namespace
}  // namespace gpulock
