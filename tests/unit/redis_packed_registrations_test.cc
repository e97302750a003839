// unpack_registrations() (redis/packed_registrations.h): the register script's package of a
// host's GPUs, read back exactly, and refused whole when it is anything else.
#include "redis/packed_registrations.h"

#include <gtest/gtest.h>

#include <string>

namespace gpulock {
namespace {

std::string field(const std::string& bytes) {
  return std::to_string(bytes.size()) + ":" + bytes;
}

TEST(PackedRegistrationsTest, EachGpuIsReadByItsUuid) {
  const std::string packed = field("1795768474690") + field("GPU-a") + field("{\"index\":0}") +
                             field("{\"utilization\":3}") + field("GPU-b") +
                             field("{\"x\":\":\"}") + field("");
  const auto gpus = unpack_registrations(packed);
  ASSERT_TRUE(gpus.has_value());
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ(gpus->at("GPU-a").static_json, "{\"index\":0}");
  EXPECT_EQ(gpus->at("GPU-a").readings_json, "{\"utilization\":3}");
  EXPECT_EQ(gpus->at("GPU-b").static_json, "{\"x\":\":\"}");  // a colon inside a field
  EXPECT_EQ(gpus->at("GPU-b").readings_json, "");
}

TEST(PackedRegistrationsTest, AHostWithNoGpusIsJustItsReadTime) {
  const auto gpus = unpack_registrations(field("1"));
  ASSERT_TRUE(gpus.has_value());
  EXPECT_TRUE(gpus->empty());
}

TEST(PackedRegistrationsTest, AnythingElseIsUnreadableAsAWhole) {
  const std::string good = field("1") + field("GPU-a") + field("{}") + field("{}");
  EXPECT_TRUE(unpack_registrations(good).has_value());
  for (const std::string& bad : {
           std::string(),                                         // nothing, not even the read time
           good.substr(0, good.size() - 1),                       // cut short
           good + "3",                                            // a length and no colon
           good + field("GPU-b"),                                 // a GPU without its two documents
           field("1") + "x:" + "GPU-a",                           // a length that is not a number
           field("1") + ":GPU-a",                                 // no length
           field("1") + "-5:GPU-a",                               // a negative one
           field("1") + "99999999999:GPU-a",                      // too long to be real
           field("1") + "999:GPU-a" + field("{}") + field("{}"),  // past the end
       })
    EXPECT_FALSE(unpack_registrations(bad).has_value()) << bad;
}

}  // namespace
}  // namespace gpulock
