// whole_number<T>() (util/strings.h): the number the whole text is, or nothing.
#include <gtest/gtest.h>

#include <cstdint>

#include "util/strings.h"

namespace gpulock {
namespace {

TEST(WholeNumber, ReadsTheWholeText) {
  EXPECT_EQ(whole_number<std::uint64_t>("18446744073709551615"), ~std::uint64_t{0});
  EXPECT_EQ(whole_number<long long>("-42"), -42);
  EXPECT_EQ(whole_number<double>("2.5"), 2.5);
}

TEST(WholeNumber, RejectsAnythingElse) {
  for (const char* text : {"", " 1", "1 ", "1x", "+1", "-1", "18446744073709551616"})
    EXPECT_FALSE(whole_number<std::uint64_t>(text).has_value()) << '"' << text << '"';
  EXPECT_FALSE(whole_number<double>("nan?").has_value());
}

}  // namespace
}  // namespace gpulock
