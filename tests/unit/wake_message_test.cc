// Which wakes of the Redis queue are news to a waiter (redis/wake_message.h).
#include "redis/wake_message.h"

#include <gtest/gtest.h>

namespace gpulock {
namespace {

TEST(WakeMessage, ParsesVersionAndServerClock) {
  const auto moment = parse_wake_message("42 1764201600123456");
  ASSERT_TRUE(moment.has_value());
  EXPECT_EQ(moment->version, "42");
  EXPECT_EQ(moment->server_us, 1764201600123456u);
}

TEST(WakeMessage, RejectsWhatIsNotAMoment) {
  for (const char* text :
       {"", "1", " 17", "42 ", "42 x", "42 -5", "42 12 13", "42 99999999999999999999999", "42 0"})
    EXPECT_FALSE(parse_wake_message(text).has_value()) << '"' << text << '"';
}

TEST(WakeMessage, ServerClockIsDecimalMicroseconds) {
  EXPECT_EQ(parse_server_us("1764201600000001"), 1764201600000001u);
  EXPECT_EQ(parse_server_us(""), 0u);
  EXPECT_EQ(parse_server_us("12a"), 0u);
  EXPECT_EQ(parse_server_us("+12"), 0u);
}

TEST(WakeMessage, OlderWakeAtTheSameVersionIsNoNews) {
  EXPECT_FALSE(wake_is_news("7 1000", PoolMoment{"7", 1001}));
}

TEST(WakeMessage, WakeAfterTheSnapshotIsNews) {
  // Same version, later clock: a lock or ticket may have expired since (no bump for that).
  EXPECT_TRUE(wake_is_news("7 1002", PoolMoment{"7", 1001}));
  // The same microsecond: the order is unknown.
  EXPECT_TRUE(wake_is_news("7 1001", PoolMoment{"7", 1001}));
}

TEST(WakeMessage, AnotherVersionIsNewsWhateverTheClock) {
  EXPECT_TRUE(wake_is_news("8 1000", PoolMoment{"7", 1001}));
  // A server that restarted empty counts versions from 1 again.
  EXPECT_TRUE(wake_is_news("1 1000", PoolMoment{"7", 1001}));
}

TEST(WakeMessage, UnknownWakesAndUnknownSnapshotsAreNews) {
  EXPECT_TRUE(wake_is_news("1", PoolMoment{"1", 1001}));  // an older gpulock's wake
  EXPECT_TRUE(wake_is_news("", PoolMoment{"7", 1001}));
  EXPECT_TRUE(wake_is_news("7 1000", PoolMoment{"7", 0}));  // an older server script's snapshot
  EXPECT_TRUE(wake_is_news("7 1000", PoolMoment{"", 1001}));
}

}  // namespace
}  // namespace gpulock
