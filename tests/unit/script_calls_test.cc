// The acquire scripts' named arguments and replies: each field lands where its .lua reads it.
#include "redis/script_calls.h"

#include <gtest/gtest.h>

namespace gpulock {
namespace {

using std::chrono::milliseconds;

RedisValue text(std::string s) {
  RedisValue v;
  v.type = RedisValue::Type::kString;
  v.text = std::move(s);
  return v;
}
RedisValue integer(long long n) {
  RedisValue v;
  v.type = RedisValue::Type::kInteger;
  v.integer = n;
  return v;
}
RedisValue array(std::vector<RedisValue> elements) {
  RedisValue v;
  v.type = RedisValue::Type::kArray;
  v.elements = std::move(elements);
  return v;
}

AcquireArgs TwoGpus() {
  AcquireArgs args;
  args.lease_id = "L";
  args.ttl = milliseconds(30000);
  args.expected_version = "v7";
  args.record_json = "{}";
  args.user = "alice";
  args.gpu_host = "node1";
  args.ticket_id = "T";
  args.limited = true;
  args.to_wake = {"a", "b"};
  args.gpus = {"GPU-1", "GPU-2"};
  return args;
}

TEST(ScriptCallsTest, AcquireArgumentsAreWhereAcquireLuaReadsThem) {
  const std::vector<std::string> argv = TwoGpus().argv();
  // ARGV[1..11], then the UUIDs from ARGV[12] (lua/acquire.lua).
  const std::vector<std::string> expected{
      "L", "30000", "v7", "2", "all", "{}", "alice", "node1", "T", "1", "a\nb\n", "GPU-1", "GPU-2"};
  EXPECT_EQ(argv, expected);
}

TEST(ScriptCallsTest, AResentAcquireMatchesNoVersionAndWakesNoOne) {
  const AcquireArgs again = TwoGpus().resent();
  const std::vector<std::string> argv = again.argv();
  EXPECT_NE(argv[2], "v7");
  EXPECT_FALSE(argv[2].empty());  // empty would mean "any version"
  EXPECT_EQ(argv[10], "");
  EXPECT_EQ(argv[0], "L");  // the same lease: the script finds the first run's
  EXPECT_EQ(std::vector<std::string>(argv.begin() + 11, argv.end()),
            (std::vector<std::string>{"GPU-1", "GPU-2"}));
}

TEST(ScriptCallsTest, SharedOffersComeInFoursAndAResendOffersNoRoom) {
  AcquireSharedArgs args;
  args.lease_id = "S";
  args.ttl = milliseconds(5000);
  args.record_json = "{}";
  args.user = "bob";
  args.needed = 1;
  args.spread = true;
  args.offers = {{"GPU-1", "h1", 100, 10}, {"GPU-2", "h2", 50, 10}};
  const std::vector<std::string> argv = args.argv();
  const std::vector<std::string> expected{"S",     "5000", "{}",  "bob", "1",     "",   "1",  "0",
                                          "GPU-1", "h1",   "100", "10",  "GPU-2", "h2", "50", "10"};
  EXPECT_EQ(argv, expected);
  args.cap = 3;
  EXPECT_EQ(args.argv()[5], "3");
  const std::vector<std::string> again = args.resent().argv();
  EXPECT_EQ(again[10], "0");
  EXPECT_EQ(again[14], "0");
  EXPECT_EQ(again[11], "10");  // what it wants is unchanged
}

TEST(ScriptCallsTest, RepliesAreReadByShape) {
  const AcquireReply ok =
      parse_acquire_reply(array({text("ok"), text("41"), text("GPU-1"), text("GPU-2")}));
  EXPECT_EQ(ok.outcome, "ok");
  EXPECT_EQ(ok.token_text, "41");
  EXPECT_EQ(ok.uuids, (std::vector<std::string>{"GPU-1", "GPU-2"}));

  EXPECT_EQ(parse_acquire_reply(array({text("stale")})).outcome, "stale");
  EXPECT_EQ(parse_acquire_reply(text("ok")).outcome, "");  // not an array
  EXPECT_EQ(parse_acquire_reply(array({})).outcome, "");

  const AcquireReply shared =
      parse_acquire_shared_reply(array({text("ok"), text("9"), text("GPU-1"), text("12")}));
  EXPECT_EQ(shared.outcome, "ok");
  EXPECT_EQ(shared.uuids, std::vector<std::string>{"GPU-1"});
  EXPECT_EQ(shared.units, std::vector<std::string>{"12"});
  // A UUID without its units is no reply of the script's.
  EXPECT_EQ(parse_acquire_shared_reply(array({text("ok"), text("9"), text("GPU-1")})).outcome, "");
  const AcquireReply exhausted = parse_acquire_shared_reply(
      array({text("exhausted"), text("18446744073709551615"), text("token")}));
  EXPECT_EQ(exhausted.outcome, "exhausted");
}

TEST(ScriptCallsTest, EnterArgumentsAndReply) {
  EnterArgs entry{"T", milliseconds(6000), "body", "alice", "h1,h2", "v3", "12", true};
  const std::vector<std::string> expected{"T", "6000", "body", "alice", "h1,h2", "v3", "1", "12"};
  EXPECT_EQ(entry.argv(), expected);
  entry.behind_everyone = false;
  EXPECT_EQ(entry.argv()[6], "");

  const EnterReply reply = parse_enter_reply(
      array({integer(5), integer(1), text("v4"), text("1700000000000000"), integer(3)}));
  EXPECT_TRUE(reply.complete);
  EXPECT_TRUE(reply.unchanged);
  EXPECT_EQ(reply.version, "v4");
  EXPECT_EQ(reply.server_us, "1700000000000000");
  EXPECT_EQ(reply.queued, 3);
  EXPECT_FALSE(parse_enter_reply(array({integer(5), integer(1)})).complete);
  EXPECT_FALSE(parse_enter_reply(text("x")).complete);
}

}  // namespace
}  // namespace gpulock
