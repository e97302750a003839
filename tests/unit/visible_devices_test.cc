// CUDA_VISIBLE_DEVICES (src/visible_devices.h): which devices a caller's value leaves visible,
// with CUDA's reading rules, and the value gpulock writes for a lease.
#include "backend/visible_devices.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpulock {
namespace {

const char* const kUuid0 = "GPU-aaaa1111-0000-4000-8000-000000000000";
const char* const kUuid1 = "GPU-bbbb2222-0000-4000-8000-000000000001";
const char* const kUuid2 = "GPU-bbbb3333-0000-4000-8000-000000000002";
const char* const kMig20 = "MIG-cccc0000-0000-4000-8000-000000000020";
const char* const kMig21 = "MIG-cccc0001-0000-4000-8000-000000000021";

Device Gpu(unsigned index, const std::string& uuid) {
  Device d;
  d.index = index;
  d.uuid = uuid;
  return d;
}

Device Mig(unsigned parent_index, unsigned mig_index, const std::string& uuid,
           const std::string& parent_uuid) {
  Device d;
  d.index = parent_index;
  d.mig_index = mig_index;
  d.uuid = uuid;
  d.parent_uuid = parent_uuid;
  return d;
}

class VisibleUnderTest : public ::testing::Test {
 protected:
  const Device gpu0_ = Gpu(0, kUuid0);
  const Device gpu1_ = Gpu(1, kUuid1);
  const Device gpu2_ = Gpu(2, kUuid2);
  const Device mig20_ = Mig(2, 0, kMig20, kUuid2);
  const Device mig21_ = Mig(2, 1, kMig21, kUuid2);

  // The devices visible under value, as display indices, in device order.
  std::vector<std::string> Visible(const std::string& value) const {
    std::vector<std::string> out;
    for (const Device* d : {&gpu0_, &gpu1_, &gpu2_, &mig20_, &mig21_})
      if (visible_under(*d, value)) out.push_back(d->display_index());
    return out;
  }
};

using Names = std::vector<std::string>;

TEST_F(VisibleUnderTest, Indices) {
  EXPECT_EQ(Visible("0"), (Names{"0"}));
  EXPECT_EQ(Visible("1,0"), (Names{"0", "1"}));
  EXPECT_EQ(Visible(" 1 , 0 "), (Names{"0", "1"}));
  EXPECT_EQ(Visible("7"), Names{});
  EXPECT_EQ(Visible("00"), (Names{"0"}));
}

TEST_F(VisibleUnderTest, AnIndexIncludesTheGpusMigInstances) {
  EXPECT_EQ(Visible("2"), (Names{"2", "2:0", "2:1"}));
}

TEST_F(VisibleUnderTest, FullUuidsAndPrefixes) {
  EXPECT_EQ(Visible(kUuid1), (Names{"1"}));
  EXPECT_EQ(Visible("GPU-aaaa"), (Names{"0"}));
  EXPECT_EQ(Visible("GPU-aaaa1111-0000"), (Names{"0"}));
  EXPECT_EQ(Visible(std::string(kUuid0) + "," + kUuid1), (Names{"0", "1"}));
  // A prefix that names no device hides nothing else in the list.
  EXPECT_EQ(Visible("GPU-ffff,1"), (Names{"1"}));
}

TEST_F(VisibleUnderTest, MigUuidsNameOneInstance) {
  EXPECT_EQ(Visible(kMig21), (Names{"2:1"}));
  EXPECT_EQ(Visible("MIG-cccc0000"), (Names{"2:0"}));
  EXPECT_EQ(Visible("MIG-cccc"), (Names{"2:0", "2:1"}));
}

TEST_F(VisibleUnderTest, GpuPrefixMatchesAMigInstancesParent) {
  EXPECT_EQ(Visible(kUuid2), (Names{"2", "2:0", "2:1"}));
  EXPECT_EQ(Visible("GPU-bbbb3"), (Names{"2", "2:0", "2:1"}));
  // ...but a MIG prefix never matches a whole GPU, and a parent prefix never another parent.
  EXPECT_EQ(Visible("GPU-bbbb2"), (Names{"1"}));
}

TEST_F(VisibleUnderTest, AnInvalidEntryEndsTheList) {
  EXPECT_EQ(Visible("0,foo,1"), (Names{"0"}));
  EXPECT_EQ(Visible("-1,0"), Names{});
  EXPECT_EQ(Visible("0,2,-1,1"), (Names{"0", "2", "2:0", "2:1"}));
  EXPECT_EQ(Visible("0,,1"), (Names{"0"}));  // an empty entry cannot be parsed either
  EXPECT_EQ(Visible("1,GPU-"), (Names{"1"}));
  EXPECT_EQ(Visible("GPU-,1"), Names{});
  EXPECT_EQ(Visible("gpu-aaaa,0"), Names{});  // CUDA's prefixes are case-sensitive
  EXPECT_EQ(Visible("1:0,1"), Names{});
}

TEST_F(VisibleUnderTest, EmptyValueHidesAll) {
  EXPECT_EQ(Visible(""), Names{});
  EXPECT_EQ(Visible(" "), Names{});
  EXPECT_EQ(Visible("NoDevFiles"), Names{});
}

TEST_F(VisibleUnderTest, HugeIndexDoesNotThrow) {
  EXPECT_NO_THROW(Visible("99999999999999999999999999,0"));
  EXPECT_EQ(Visible("99999999999999999999999999,0"), (Names{"0"}));
}

// --- format_visible_devices ---------------------------------------------------------------

std::vector<LeasedGpu> LeasedSet() {
  return {LeasedGpu{0, "0", kUuid0, "A", false}, LeasedGpu{2, "2", kUuid2, "B", false}};
}

TEST(FormatVisibleDevicesTest, ByIndex) {
  EXPECT_EQ(format_visible_devices(LeasedSet(), VisibleFormat::kIndex), "0,2");
}

TEST(FormatVisibleDevicesTest, ByUuid) {
  EXPECT_EQ(format_visible_devices(LeasedSet(), VisibleFormat::kUuid),
            std::string(kUuid0) + "," + kUuid2);
}

TEST(FormatVisibleDevicesTest, MigAlwaysByUuid) {
  const std::vector<LeasedGpu> gpus = {LeasedGpu{0, "0", kUuid0, "A", false},
                                       LeasedGpu{2, "2:1", kMig21, "B MIG", true}};
  EXPECT_EQ(format_visible_devices(gpus, VisibleFormat::kIndex), std::string("0,") + kMig21);
  EXPECT_EQ(format_visible_devices(gpus, VisibleFormat::kUuid), std::string(kUuid0) + "," + kMig21);
}

TEST(FormatVisibleDevicesTest, EmptyLease) {
  EXPECT_EQ(format_visible_devices({}, VisibleFormat::kIndex), "");
  EXPECT_EQ(format_visible_devices({}, VisibleFormat::kUuid), "");
}

TEST(FormatVisibleDevicesTest, OutputIsVisibleUnderItself) {
  // What gpulock writes must read back as exactly the leased devices.
  const Device gpu0 = Gpu(0, kUuid0), gpu1 = Gpu(1, kUuid1), gpu2 = Gpu(2, kUuid2);
  const std::vector<LeasedGpu> gpus = {LeasedGpu{0, "0", kUuid0, "A", false},
                                       LeasedGpu{2, "2", kUuid2, "B", false}};
  for (VisibleFormat format : {VisibleFormat::kIndex, VisibleFormat::kUuid}) {
    const std::string value = format_visible_devices(gpus, format);
    EXPECT_TRUE(visible_under(gpu0, value)) << value;
    EXPECT_FALSE(visible_under(gpu1, value)) << value;
    EXPECT_TRUE(visible_under(gpu2, value)) << value;
  }
}

}  // namespace
}  // namespace gpulock
