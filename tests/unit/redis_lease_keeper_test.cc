// RedisLeaseKeeper against a real redis-server: it keeps a lease's keys alive with a short TTL,
// releases them when destroyed, and reports the lease lost (once) when the server is paused past
// the TTL, when another lease takes a GPU, or when someone releases it. Waits are polls with
// deadlines of several seconds; nothing depends on exact timing.
#include "redis/redis_lease_keeper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "redis/redis_connection_cache.h"
#include "redis/redis_scripts.h"
#include "redis_test_pool.h"
#include "redis_test_server.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test_support::AcquireArgs;
using test_support::RedisPoolKeys;
using test_support::RedisTestServer;
using test_support::TestUuid;

// Polls `condition` until it holds or `limit` passes; returns whether it held.
bool Eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return condition();
}

class RedisLeaseKeeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto connection = server_.connect();
    test_support::RegisterHost(*connection, keys_, "h1", 2);
  }

  std::string Get(const std::string& key) {
    const RedisValue v = server_.command({"GET", key});
    return v.is_nil() ? "(nil)" : v.text;
  }
  long long Pttl(const std::string& key) { return server_.command({"PTTL", key}).integer; }
  bool Exists(const std::string& key) { return server_.command({"EXISTS", key}).integer == 1; }

  // Takes the pool's two GPUs with the acquire script and returns a keeper for the lease.
  // `backdate`: the acquire counts as sent that much earlier than it was.
  std::unique_ptr<RedisLeaseKeeper> Hold(std::chrono::milliseconds ttl,
                                         Clock::duration backdate = {}) {
    auto connection = server_.connect();
    AcquireArgs a;
    a.lease_id = lease_id_;
    a.ttl_ms = ttl.count();
    a.expected_version = server_.command({"GET", keys_.version()}).text;
    a.needed = 2;
    a.candidates = uuids_;
    const auto sent = Clock::now();
    const RedisValue reply = test_support::RunAcquire(*connection, keys_, a);
    const auto texts = test_support::Texts(reply);
    if (texts.empty() || texts[0] != "ok") {
      ADD_FAILURE() << "acquire failed";
      return nullptr;
    }
    token_ = std::stoull(texts[1]);
    RedisLeaseTerms terms{keys_.version(), ttl, lease_id_, token_, uuids_, "tester", "h1", {}};
    return std::make_unique<RedisLeaseKeeper>(std::move(terms), "{\"record\":1}", cache_,
                                              sent - backdate);
  }

  // Counts on_lost calls and keeps the last reason.
  struct LostLog {
    std::atomic<int> calls{0};
    std::mutex mutex;
    std::string reason;
    std::function<void(const std::string&)> callback() {
      return [this](const std::string& why) {
        {
          std::lock_guard<std::mutex> lock(mutex);
          reason = why;
        }
        ++calls;
      };
    }
    std::string last() {
      std::lock_guard<std::mutex> lock(mutex);
      return reason;
    }
  };

  RedisTestServer server_;
  RedisPoolKeys keys_{"k"};
  std::vector<std::string> uuids_{TestUuid("h1", 0), TestUuid("h1", 1)};
  std::string lease_id_ = make_lease_id();
  std::uint64_t token_ = 0;
  std::shared_ptr<RedisConnectionCache> cache_ =
      std::make_shared<RedisConnectionCache>(server_.endpoint(), std::chrono::milliseconds(5000));
};

TEST_F(RedisLeaseKeeperTest, KeepsTheLockAliveWellPastItsTtl) {
  // Renewed every third of it: a TTL that a loaded machine (or TSan) cannot stall a renewal for.
  constexpr auto kTtl = 1500ms;
  auto keeper = Hold(kTtl);
  ASSERT_TRUE(keeper);
  LostLog lost;
  keeper->on_lost(lost.callback());
  // Four TTLs: without renewals the keys would have expired long before the end.
  const auto end = Clock::now() + 4 * kTtl;
  long long lowest = kTtl.count();
  while (Clock::now() < end) {
    for (const auto& uuid : uuids_) {
      ASSERT_EQ(Get(keys_.lock(uuid)), lease_id_);
      const long long ttl = Pttl(keys_.lock(uuid));
      EXPECT_GT(ttl, 0);
      EXPECT_LE(ttl, kTtl.count());
      lowest = std::min(lowest, ttl);
    }
    ASSERT_TRUE(Exists(keys_.lease(lease_id_)));
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_FALSE(keeper->lost());
  EXPECT_EQ(lost.calls.load(), 0);
  EXPECT_EQ(server_.command({"HGET", keys_.lease(lease_id_), "record"}).text, "{\"record\":1}");
}

TEST_F(RedisLeaseKeeperTest, ALeaseWhoseTtlHasPassedIsLostToWhoeverAsksFirst) {
  // As after a pause (SIGSTOP) past the TTL: the first question, asked before the renewal thread
  // can have run, already gets the clock's answer.
  auto keeper = Hold(10s, 11s);
  ASSERT_TRUE(keeper);
  EXPECT_TRUE(keeper->lost());
}

TEST_F(RedisLeaseKeeperTest, ALeaseStartedLateInItsTtlIsRenewedAtOnce) {
  // As a lease taken back after an outage (its acquire's answer was lost): 7 s of its 10 s TTL
  // have passed when the keeper starts. Its first renewal is due a third of the TTL after the
  // acquire was sent, so at once; counted from the keeper's start (3.3 s), it came after the
  // TTL had run out, and the lease was lost though the server still held it.
  auto keeper = Hold(10s, 7s);
  ASSERT_TRUE(keeper);
  std::this_thread::sleep_for(3500ms);
  EXPECT_FALSE(keeper->lost());
  EXPECT_EQ(Get(keys_.lock(uuids_[0])), lease_id_);
}

TEST_F(RedisLeaseKeeperTest, UpdateRecordPublishesTheNewRecord) {
  auto keeper = Hold(10s);
  ASSERT_TRUE(keeper);
  keeper->update_record("{\"record\":2}");
  EXPECT_TRUE(Eventually([&] {
    return server_.command({"HGET", keys_.lease(lease_id_), "record"}).text == "{\"record\":2}";
  }));
  EXPECT_FALSE(keeper->lost());
}

TEST_F(RedisLeaseKeeperTest, DestroyingItReleasesTheLease) {
  auto keeper = Hold(10s);
  ASSERT_TRUE(keeper);
  ASSERT_EQ(Get(keys_.lock(uuids_[0])), lease_id_);
  keeper.reset();
  for (const auto& uuid : uuids_) EXPECT_FALSE(Exists(keys_.lock(uuid))) << uuid;
  EXPECT_FALSE(Exists(keys_.lease(lease_id_)));
  EXPECT_TRUE(Exists(keys_.ended(lease_id_)));
}

TEST_F(RedisLeaseKeeperTest, DestroyingItLeavesAnotherLeasesLockAlone) {
  auto keeper = Hold(10s);
  ASSERT_TRUE(keeper);
  server_.command({"SET", keys_.lock(uuids_[1]), "someone-else"});
  keeper.reset();
  EXPECT_FALSE(Exists(keys_.lock(uuids_[0])));
  EXPECT_EQ(Get(keys_.lock(uuids_[1])), "someone-else");
}

TEST_F(RedisLeaseKeeperTest, APausedServerPastTheTtlLosesTheLeaseOnce) {
  constexpr auto kTtl = 600ms;
  auto keeper = Hold(kTtl);
  ASSERT_TRUE(keeper);
  LostLog lost;
  keeper->on_lost(lost.callback());
  constexpr auto kPause = 3000ms;
  {
    auto pauser = server_.connect();
    const auto paused = pauser->command({"CLIENT", "PAUSE", std::to_string(kPause.count()), "ALL"});
    ASSERT_EQ(paused.text, "OK") << paused.text;
  }
  const auto paused_at = Clock::now();
  EXPECT_TRUE(Eventually([&] { return keeper->lost(); }, 10s));
  EXPECT_TRUE(Eventually([&] { return lost.calls.load() >= 1; }, 5s));
  EXPECT_NE(lost.last().find("TTL"), std::string::npos) << lost.last();
  // After the pause, the lease stays lost and the callback is not called again.
  std::this_thread::sleep_until(paused_at + kPause + 3 * kTtl);
  EXPECT_TRUE(keeper->lost());
  EXPECT_EQ(lost.calls.load(), 1);
  // A lost lease is not renewed: its keys expire (the pause had stopped expiry too).
  EXPECT_TRUE(Eventually([&] { return !Exists(keys_.lock(uuids_[0])); }, 10s));
}

TEST_F(RedisLeaseKeeperTest, ALockTakenByAnotherLeaseIsReportedLostOnce) {
  auto keeper = Hold(900ms);
  ASSERT_TRUE(keeper);
  LostLog lost;
  keeper->on_lost(lost.callback());
  server_.command({"SET", keys_.lock(uuids_[1]), "0123456789abcdef", "PX", "60000"});
  EXPECT_TRUE(Eventually([&] { return keeper->lost(); }));
  EXPECT_TRUE(Eventually([&] { return lost.calls.load() >= 1; }, 5s));
  const std::string reason = lost.last();
  EXPECT_NE(reason.find("0123456789abcdef"), std::string::npos) << reason;
  EXPECT_NE(reason.find(uuids_[1]), std::string::npos) << reason;
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(lost.calls.load(), 1);
  // It never steals the GPU back, even when destroyed.
  EXPECT_EQ(Get(keys_.lock(uuids_[1])), "0123456789abcdef");
  keeper.reset();
  EXPECT_EQ(Get(keys_.lock(uuids_[1])), "0123456789abcdef");
}

TEST_F(RedisLeaseKeeperTest, AReleaseBySomeoneElseIsReportedLost) {
  auto keeper = Hold(900ms);
  ASSERT_TRUE(keeper);
  LostLog lost;
  keeper->on_lost(lost.callback());
  auto connection = server_.connect();
  connection->run(redis_scripts::kRelease, {keys_.version()}, {lease_id_});
  EXPECT_TRUE(Eventually([&] { return keeper->lost(); }));
  EXPECT_TRUE(Eventually([&] { return lost.calls.load() >= 1; }, 5s));
  EXPECT_NE(lost.last().find("released"), std::string::npos) << lost.last();
  // Its keys are not re-created.
  std::this_thread::sleep_for(1s);
  EXPECT_FALSE(Exists(keys_.lock(uuids_[0])));
  EXPECT_FALSE(Exists(keys_.lock(uuids_[1])));
}

TEST_F(RedisLeaseKeeperTest, KeysLostByTheServerAreRestoredAtTheNextRenewal) {
  auto keeper = Hold(1500ms);
  ASSERT_TRUE(keeper);
  ASSERT_EQ(server_.command({"FLUSHALL"}).text, "OK");
  EXPECT_TRUE(Eventually([&] {
    return Get(keys_.lock(uuids_[0])) == lease_id_ && Get(keys_.lock(uuids_[1])) == lease_id_;
  }));
  EXPECT_TRUE(Eventually([&] { return Get(keys_.token()) == std::to_string(token_); }));
  EXPECT_FALSE(keeper->lost());
}

TEST_F(RedisLeaseKeeperTest, ARestartedServerGetsTheLeaseBackBeforeTheTtlEnds) {
  // A long TTL, so that the restart (a few hundred ms) fits well inside it.
  auto keeper = Hold(8s);
  ASSERT_TRUE(keeper);
  LostLog lost;
  keeper->on_lost(lost.callback());
  server_.restart();  // empty: the keeper's next renewals re-create the keys
  EXPECT_TRUE(Eventually(
      [&] {
        return Get(keys_.lock(uuids_[0])) == lease_id_ && Get(keys_.lock(uuids_[1])) == lease_id_;
      },
      20s));
  EXPECT_FALSE(keeper->lost());
  EXPECT_EQ(lost.calls.load(), 0);
  EXPECT_EQ(Get(keys_.token()), std::to_string(token_));
}

}  // namespace
}  // namespace gpulock
