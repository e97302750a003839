// parse_fencing_token() (src/redis/fencing_token.h): a token read back from Redis is untrusted.
#include "redis/fencing_token.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpulock {
namespace {

TEST(FencingTokenTest, DecimalCountsUpTo64BitsAreTokens) {
  EXPECT_EQ(parse_fencing_token("0"), 0u);
  EXPECT_EQ(parse_fencing_token("1732412345678901"), 1732412345678901u);
  EXPECT_EQ(parse_fencing_token("9223372036854775807"), 9223372036854775807u);  // 2^63 - 1
  EXPECT_EQ(parse_fencing_token("18446744073709551615"), 18446744073709551615u);
}

TEST(FencingTokenTest, AnythingElseIsNot) {
  for (const std::string& text : std::vector<std::string>{
           "", "18446744073709551616", "99999999999999999999", "100000000000000000000", "-1", "+1",
           "01", " 1", "1 ", "1e20", "1.0", "0x10", "not-a-number", std::string("1\0", 2)})
    EXPECT_EQ(parse_fencing_token(text), std::nullopt) << text;
}

}  // namespace
}  // namespace gpulock
