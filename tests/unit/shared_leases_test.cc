// The shared-lease lock layout (src/local/shared_leases.h) on a real file with real OFD locks:
// each "lease" is an open file description of its own, as in separate processes. What is held
// is checked with plain F_OFD_SETLK probes of our own, not only with the code under test.
#include "local/shared_leases.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "local/gpu_lock_file.h"
#include "temp_dir.h"
#include "util/fd.h"

namespace gpulock {
namespace {

using test_support::TempDir;

class SharedLeasesTest : public ::testing::Test {
 protected:
  UniqueFd open_file() {
    UniqueFd fd(::open((dir_.path() / "gpu.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    EXPECT_TRUE(fd);
    return fd;
  }
  // Whether a fresh description could write-lock [start, start + len): an independent probe.
  bool free_range(off_t start, off_t len) {
    UniqueFd probe = open_file();
    return try_lock_range(probe.get(), F_WRLCK, start, len);
  }
  TempDir dir_{"shared"};
};

constexpr off_t kGpuUnits = 320;  // 80 GiB

TEST_F(SharedLeasesTest, UnitsFollowTheRequestRoundedUp) {
  EXPECT_EQ(units_for(std::uint64_t{10} << 30), 40);
  EXPECT_EQ(units_for(1), 1);
  EXPECT_EQ(units_for((std::uint64_t{10} << 30) + 1), 41);
}

TEST_F(SharedLeasesTest, SharedLeasesCoexistAndExcludeAnExclusiveOne) {
  UniqueFd a = open_file(), b = open_file(), reader = open_file();
  const auto slot_a = lock_shared_units(a.get(), kGpuUnits, 160);
  const auto slot_b = lock_shared_units(b.get(), kGpuUnits, 120);
  ASSERT_TRUE(slot_a && slot_b);
  EXPECT_EQ(*slot_a, 0);
  EXPECT_EQ(*slot_b, 160);
  EXPECT_EQ(held_mode(reader.get()), LockMode::kShared);
  const SharedUsage usage = read_shared_usage(reader.get());
  EXPECT_EQ(usage.units_held, 280);
  EXPECT_EQ(usage.slots, (std::vector<off_t>{0, 160}));
  // 40 units left: 41 do not fit, and nothing stays locked by the failed try.
  UniqueFd c = open_file();
  EXPECT_FALSE(lock_shared_units(c.get(), kGpuUnits, 41));
  EXPECT_TRUE(free_range(kSharedUnitLockBase + 280, 40));
  // An exclusive lease (whole file) is refused while shared leases hold it.
  UniqueFd exclusive = open_file();
  EXPECT_FALSE(try_lock_exclusive(exclusive.get()));
}

TEST_F(SharedLeasesTest, ClosingALeaseFreesExactlyItsUnits) {
  UniqueFd a = open_file(), b = open_file(), c = open_file();
  ASSERT_TRUE(lock_shared_units(a.get(), kGpuUnits, 100));
  ASSERT_TRUE(lock_shared_units(b.get(), kGpuUnits, 100));
  ASSERT_TRUE(lock_shared_units(c.get(), kGpuUnits, 100));
  b.reset();  // as the kernel does when its last holder dies
  EXPECT_TRUE(free_range(kSharedUnitLockBase + 100, 100));
  EXPECT_FALSE(free_range(kSharedUnitLockBase, 1));
  EXPECT_FALSE(free_range(kSharedUnitLockBase + 200, 1));
  // The gap is reused, and a lease may span several runs of free units.
  UniqueFd d = open_file();
  const auto slot = lock_shared_units(d.get(), kGpuUnits, 110);
  ASSERT_TRUE(slot);
  EXPECT_EQ(*slot, 100);
  EXPECT_FALSE(free_range(kSharedUnitLockBase + 300, 10));
  EXPECT_TRUE(free_range(kSharedUnitLockBase + 310, 10));
}

TEST_F(SharedLeasesTest, UsageIsReadWhateverOrderTheLocksWereTakenIn) {
  // C's units lie on both sides of B's, and C locked them after B: the kernel may report B's
  // lock first for a probe over all of them. Every held unit and slot must still be counted.
  UniqueFd a = open_file(), b = open_file(), reader = open_file();
  ASSERT_TRUE(lock_shared_units(a.get(), kGpuUnits, 100));
  ASSERT_TRUE(lock_shared_units(b.get(), kGpuUnits, 100));
  a.reset();
  UniqueFd c = open_file();
  ASSERT_EQ(lock_shared_units(c.get(), kGpuUnits, 150), 0);
  const SharedUsage usage = read_shared_usage(reader.get());
  EXPECT_EQ(usage.units_held, 250);
  EXPECT_EQ(usage.slots, (std::vector<off_t>{0, 100}));
  EXPECT_TRUE(free_range(kSharedUnitLockBase + 250, 70));
  EXPECT_FALSE(free_range(kSharedUnitLockBase + 249, 1));
}

TEST_F(SharedLeasesTest, AnExclusiveLeaseExcludesSharedOnes) {
  UniqueFd exclusive = open_file(), reader = open_file();
  ASSERT_TRUE(try_lock_exclusive(exclusive.get()));
  EXPECT_EQ(held_mode(reader.get()), LockMode::kExclusive);
  UniqueFd a = open_file();
  EXPECT_FALSE(lock_shared_units(a.get(), kGpuUnits, 1));
  exclusive.reset();
  EXPECT_EQ(held_mode(reader.get()), LockMode::kNone);
  EXPECT_TRUE(lock_shared_units(a.get(), kGpuUnits, 1));
}

TEST_F(SharedLeasesTest, ARecordCountsOnlyWhileItsSlotIsLocked) {
  UniqueFd a = open_file(), reader = open_file();
  const auto slot = lock_shared_units(a.get(), kGpuUnits, 4);
  ASSERT_TRUE(slot);
  HolderRecord record;
  record.lease_id = "0123456789abcdef";
  record.user = "alice";
  record.host = "h";
  record.boot_id = "b";
  record.holder = ProcessId{::getpid(), 1};
  record.started_at = 1;
  record.gpus = {"GPU-x"};
  record.memory_bytes = 4 * kSharedUnitBytes;
  ASSERT_FALSE(write_record_bytes(a.get(), serialize_holder_record(record),
                                  kSharedRecordBase + *slot * 4096));
  const auto read = read_shared_record(reader.get(), *slot, "GPU-x");
  ASSERT_TRUE(read);
  EXPECT_EQ(read->memory_bytes, 4 * kSharedUnitBytes);
  EXPECT_FALSE(read_shared_record(reader.get(), *slot, "GPU-other"));
  a.reset();
  // The record is still in the file, but no live lease holds its slot: nobody lists it.
  EXPECT_TRUE(read_shared_usage(reader.get()).slots.empty());
  EXPECT_EQ(held_mode(reader.get()), LockMode::kNone);
}

TEST_F(SharedLeasesTest, FitCountsTheReserveAndMemoryUsedOutsideGpulock) {
  Device device;
  device.memory_total_bytes = std::uint64_t{80} << 30;
  device.memory_used_bytes = std::uint64_t{12} << 30;
  Config config;
  config.shared_memory_reserve_bytes = std::uint64_t{2} << 30;
  SharedUsage usage;
  usage.units_held = 40;
  usage.slots = {0};
  // 10 GiB of the 12 GiB used belong to processes of the shared lease: 2 GiB are outside.
  const SharedFit fit = shared_fit(device, usage, config, std::uint64_t{10} << 30);
  EXPECT_EQ(fit.total_units, 320);
  EXPECT_EQ(fit.outside_units, 16);
  EXPECT_EQ(fit.free_units(), 320 - 16 - 40);
  EXPECT_EQ(fit.jobs, 1u);
}

}  // namespace
}  // namespace gpulock
