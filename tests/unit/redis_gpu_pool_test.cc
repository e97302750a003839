// GpuPool on the Redis backend (PoolOptions::backend = a redis:// URL) with simulated GPUs and a
// real redis-server: leases, exclusion between "hosts" (two GpuPool objects with different host
// names), waiting woken by a release, fencing tokens, garbage in a lock key, lost leases, and
// clear errors when the server cannot be reached or refuses the login.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.h"
#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"
#include "redis_test_pool.h"
#include "redis_test_server.h"
#include "temp_dir.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test_support::RedisPoolKeys;
using test_support::RedisTestServer;
using test_support::RedisTestServerOptions;
using test_support::TempDir;
using test_support::TestUuid;

constexpr const char* kSecret = "Sup3rS3cretPw";
constexpr const char* kPool = "gp";

LeaseRequest Count(unsigned count, std::vector<std::string> hosts = {}) {
  LeaseRequest request;
  request.count = count;
  request.wait = false;
  request.hosts = std::move(hosts);
  return request;
}

bool Eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = 10s) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return condition();
}

class RedisGpuPoolTest : public ::testing::Test {
 protected:
  // A pool as host `host` with `gpus` simulated GPUs of its own (UUIDs distinct per host).
  GpuPool Pool(const std::string& host, unsigned gpus, std::optional<std::string> url = {},
               std::chrono::milliseconds ttl = 10s) {
    const auto file = temp_.path() / (host + ".json");
    std::ofstream out(file);
    out << "{\"gpus\": [";
    for (unsigned i = 0; i < gpus; ++i)
      out << (i ? ", " : "") << "{\"uuid\": \"" << TestUuid(host, i) << "\"}";
    out << "]}";
    out.close();
    PoolOptions options;
    options.backend = url.value_or(server_.url());
    options.pool_name = kPool;
    options.host_name = host;
    options.lease_ttl = ttl;
    options.config = Config{};
    return GpuPool(make_simulated_source_from_file(file.string()), options);
  }

  std::string Get(const std::string& key) {
    const RedisValue v = server_.command({"GET", key});
    return v.is_nil() ? "(nil)" : v.text;
  }

  RedisTestServer server_;
  RedisPoolKeys keys_{kPool};
  TempDir temp_{"redis-pool"};
};

TEST_F(RedisGpuPoolTest, AcquireAndRelease) {
  GpuPool pool = Pool("hostA", 2);
  EXPECT_EQ(pool.backend_name(), "redis");
  EXPECT_TRUE(pool.lock_dir().empty());
  Lease lease = pool.acquire(Count(2));
  ASSERT_TRUE(lease.active());
  EXPECT_TRUE(is_lease_id(lease.id())) << lease.id();
  EXPECT_EQ(lease.host(), "hostA");
  EXPECT_GT(lease.fencing_token(), 0u);
  EXPECT_TRUE(lease.lock_fds().empty());
  EXPECT_FALSE(lease.lost());
  ASSERT_EQ(lease.gpus().size(), 2u);
  std::set<std::string> uuids;
  for (const auto& gpu : lease.gpus()) uuids.insert(gpu.uuid);
  EXPECT_EQ(uuids, (std::set<std::string>{TestUuid("hostA", 0), TestUuid("hostA", 1)}));
  for (const auto& uuid : uuids) EXPECT_EQ(Get(keys_.lock(uuid)), lease.id()) << uuid;
  EXPECT_EQ(server_.command({"HGET", keys_.lease(lease.id()), "token"}).text,
            std::to_string(lease.fencing_token()));

  const PoolStatus status = pool.status();
  EXPECT_EQ(status.backend, "redis");
  EXPECT_EQ(status.pool, kPool);
  ASSERT_EQ(status.gpus.size(), 2u);
  for (const auto& gpu : status.gpus) {
    EXPECT_EQ(gpu.state, GpuState::kLeased);
    ASSERT_TRUE(gpu.holder);
    EXPECT_EQ(gpu.holder->lease_id, lease.id());
  }

  const std::uint64_t first_token = lease.fencing_token();
  lease.release();
  EXPECT_FALSE(lease.active());
  for (const auto& uuid : uuids) EXPECT_EQ(Get(keys_.lock(uuid)), "(nil)") << uuid;
  for (const auto& gpu : pool.status().gpus) EXPECT_EQ(gpu.state, GpuState::kFree);

  Lease again = pool.acquire(Count(1));
  EXPECT_GT(again.fencing_token(), first_token);
}

TEST_F(RedisGpuPoolTest, FencingTokensIncreaseFromLeaseToLease) {
  GpuPool pool = Pool("hostA", 2);
  std::uint64_t last = 0;
  for (int i = 0; i < 10; ++i) {
    Lease lease = pool.acquire(Count(1 + i % 2));
    EXPECT_GT(lease.fencing_token(), last) << i;
    last = lease.fencing_token();
  }
}

TEST_F(RedisGpuPoolTest, FencingTokensIncreaseAcrossARestartThatLostTheData) {
  GpuPool pool = Pool("hostA", 1);
  const std::uint64_t last = pool.acquire(Count(1)).fencing_token();
  server_.restart();
  Lease after = pool.acquire(Count(1));
  EXPECT_GT(after.fencing_token(), last);
}

// After the server restarts empty, status() notices that its host is missing from the pool and
// registers again at once (its registration is otherwise cached for 30 s).
TEST_F(RedisGpuPoolTest, StatusAfterARestartShowsThisHostsGpus) {
  GpuPool pool = Pool("hostA", 1);
  EXPECT_EQ(pool.status().gpus.size(), 1u);
  server_.restart();
  EXPECT_EQ(pool.status().gpus.size(), 1u);
  EXPECT_EQ(pool.status().gpus.size(), 1u);
}

// After the server restarts, the pool's idle connection is dead: the first acquire, status or
// queue must connect again and succeed (the server is up), not fail.
TEST_F(RedisGpuPoolTest, TheFirstCallAfterARestartSucceeds) {
  GpuPool pool = Pool("hostA", 1);
  const std::vector<std::pair<const char*, std::function<void()>>> calls{
      {"acquire", [&] { pool.acquire(Count(1)); }},
      {"status", [&] { pool.status(); }},
      {"queue", [&] { pool.queue(); }}};
  for (const auto& [name, call] : calls) {
    pool.status();  // leaves an idle connection in the pool's cache
    server_.restart();
    try {
      call();
    } catch (const Error& error) {
      ADD_FAILURE() << name << " after a restart: " << error.what();
    }
  }
}

TEST_F(RedisGpuPoolTest, TwoHostsExcludeEachOtherWithHostAny) {
  GpuPool a = Pool("hostA", 2);
  GpuPool b = Pool("hostB", 2);
  b.status();  // registers hostB's GPUs
  std::vector<Lease> held;
  std::map<std::string, int> per_host;
  std::set<std::string> uuids;
  for (int i = 0; i < 4; ++i) {
    held.push_back(a.acquire(Count(1, {"any"})));
    per_host[held.back().host()]++;
    uuids.insert(held.back().gpus().at(0).uuid);
  }
  EXPECT_EQ(uuids.size(), 4u);
  EXPECT_EQ(per_host, (std::map<std::string, int>{{"hostA", 2}, {"hostB", 2}}));
  // Every GPU of the pool is held: nobody gets one.
  ExpectError([&] { b.acquire(Count(1, {"any"})); }, ErrorCode::kTimedOut, "not free now");
  ExpectError([&] { b.acquire(Count(1)); }, ErrorCode::kTimedOut);
  ExpectError([&] { a.acquire(Count(1, {"hostB"})); }, ErrorCode::kTimedOut);

  // One of hostB's GPUs comes back: hostB gets exactly that one.
  std::string freed;
  for (auto& lease : held)
    if (lease.host() == "hostB" && freed.empty()) {
      freed = lease.gpus().at(0).uuid;
      lease.release();
    }
  Lease mine = b.acquire(Count(1));
  EXPECT_EQ(mine.host(), "hostB");
  EXPECT_EQ(mine.gpus().at(0).uuid, freed);
  ExpectError([&] { a.acquire(Count(1, {"any"})); }, ErrorCode::kTimedOut);
}

// Another host's GPUs are shown from its packed registrations (one read for the host); a package
// that someone damaged makes those GPUs unreadable, with a warning, and nothing else.
TEST_F(RedisGpuPoolTest, AnotherHostsGpusComeFromItsPackageAndADamagedOneIsAWarning) {
  GpuPool a = Pool("hostA", 1);
  GpuPool b = Pool("hostB", 2);
  b.status();  // registers hostB's GPUs
  PoolStatus whole = a.pool_status();
  ASSERT_EQ(whole.gpus.size(), 3u);
  EXPECT_TRUE(whole.warnings.empty());
  std::set<std::string> of_b;
  for (const auto& g : whole.gpus)
    if (g.host == "hostB") of_b.insert(g.device.uuid);
  EXPECT_EQ(of_b, (std::set<std::string>{TestUuid("hostB", 0), TestUuid("hostB", 1)}));
  server_.command({"HSET", keys_.prefix() + "host:hostB", "gpus", "5:1234" + std::string("9:GPU")});
  whole = a.pool_status();
  ASSERT_EQ(whole.gpus.size(), 1u);
  EXPECT_EQ(whole.gpus[0].host, "hostA");
  ASSERT_EQ(whole.warnings.size(), 2u);
  EXPECT_NE(whole.warnings[0].find("is unreadable"), std::string::npos) << whole.warnings[0];
  EXPECT_EQ(a.acquire(Count(1)).gpus().at(0).uuid, TestUuid("hostA", 0));
}

TEST_F(RedisGpuPoolTest, AMultiGpuLeaseComesFromOneHost) {
  GpuPool a = Pool("hostA", 2);
  GpuPool b = Pool("hostB", 3);
  b.status();
  Lease lease = a.acquire(Count(3, {"any"}));
  EXPECT_EQ(lease.host(), "hostB");
  std::set<std::string> uuids;
  for (const auto& gpu : lease.gpus()) uuids.insert(gpu.uuid);
  EXPECT_EQ(uuids, (std::set<std::string>{TestUuid("hostB", 0), TestUuid("hostB", 1),
                                          TestUuid("hostB", 2)}));
  // Only hostB has three GPUs: the next such request waits for them.
  ExpectError([&] { a.acquire(Count(3, {"any"})); }, ErrorCode::kTimedOut);
  // Four GPUs are on no single host.
  ExpectError([&] { a.acquire(Count(4, {"any"})); }, ErrorCode::kUnsatisfiable, "on one host");
}

TEST_F(RedisGpuPoolTest, UnknownHostsAndIndicesAcrossHostsAreRefused) {
  GpuPool a = Pool("hostA", 1);
  ExpectError([&] { a.acquire(Count(1, {"nohost"})); }, ErrorCode::kUnsatisfiable, "no host");
  LeaseRequest named;
  named.gpus = {"0"};
  named.hosts = {"any"};
  named.wait = false;
  ExpectError([&] { a.acquire(named); }, ErrorCode::kInvalidArgument, "UUID");
}

TEST_F(RedisGpuPoolTest, AWaitingAcquireIsServedWhenTheHolderReleases) {
  GpuPool a = Pool("hostA", 1);
  GpuPool b = Pool("hostB", 1);
  Lease held = a.acquire(Count(1));
  LeaseRequest wait_for_a = Count(1, {"hostA"});
  wait_for_a.wait = true;
  wait_for_a.timeout = std::chrono::minutes(2);  // hang guard
  auto waiter = std::async(std::launch::async, [&] { return b.acquire(wait_for_a); });
  // Once it waits in the queue, end the lease that blocks it.
  ASSERT_TRUE(Eventually(
      [&] {
        return server_.command({"ZCARD", keys_.queue()}).integer == 1;
      },
      30s));
  const std::string uuid = held.gpus().at(0).uuid;
  held.release();
  ASSERT_EQ(waiter.wait_for(60s), std::future_status::ready);
  Lease got = waiter.get();
  EXPECT_EQ(got.host(), "hostA");
  EXPECT_EQ(got.gpus().at(0).uuid, uuid);
  EXPECT_EQ(server_.command({"ZCARD", keys_.queue()}).integer, 0);
}

TEST_F(RedisGpuPoolTest, AGarbageLockKeyMakesItsGpuUnusableNeverFree) {
  GpuPool pool = Pool("hostA", 2);
  pool.status();
  const std::string bad = TestUuid("hostA", 0);
  server_.command({"SET", keys_.lock(bad), "hello world"});
  const PoolStatus status = pool.status();
  ASSERT_EQ(status.gpus.size(), 2u);
  EXPECT_EQ(status.gpus[0].device.uuid, bad);
  EXPECT_EQ(status.gpus[0].state, GpuState::kExcluded);
  EXPECT_NE(status.gpus[0].note.find("not a lease"), std::string::npos) << status.gpus[0].note;
  EXPECT_EQ(status.gpus[1].state, GpuState::kFree);

  LeaseRequest named;
  named.gpus = {bad};
  named.wait = false;
  ExpectError([&] { pool.acquire(named); }, ErrorCode::kUnsatisfiable, "not a lease");
  Lease lease = pool.acquire(Count(1));
  EXPECT_EQ(lease.gpus().at(0).uuid, TestUuid("hostA", 1));
  ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kTimedOut);
  EXPECT_EQ(Get(keys_.lock(bad)), "hello world");

  // A hash in the lock key too.
  server_.command({"DEL", keys_.lock(bad)});
  server_.command({"HSET", keys_.lock(bad), "x", "y"});
  EXPECT_EQ(pool.status().gpus[0].state, GpuState::kExcluded);
  ExpectError([&] { pool.acquire(named); }, ErrorCode::kUnsatisfiable, "not a lease");
}

TEST_F(RedisGpuPoolTest, ALeaseWhoseGpuIsTakenOverIsLost) {
  GpuPool pool = Pool("hostA", 1, std::nullopt, 900ms);
  Lease lease = pool.acquire(Count(1));
  std::promise<std::string> reason;
  lease.on_lost([&](const std::string& why) { reason.set_value(why); });
  server_.command({"SET", keys_.lock(lease.gpus().at(0).uuid), make_lease_id(), "PX", "60000"});
  auto lost = reason.get_future();
  ASSERT_EQ(lost.wait_for(30s), std::future_status::ready);
  EXPECT_NE(lost.get().find("another lease"), std::string::npos);
  EXPECT_TRUE(lease.lost());
}

TEST_F(RedisGpuPoolTest, VerifyAsksRedisAndFindsATakenGpuAtOnce) {
  GpuPool pool = Pool("hostA", 2, std::nullopt, 30s);  // renewals far apart: only verify() asks
  Lease lease = pool.acquire(Count(2));
  EXPECT_EQ(lease.verify(), lease.fencing_token());
  const std::string other = make_lease_id();
  server_.command({"SET", keys_.lock(lease.gpus().at(1).uuid), other, "PX", "60000"});
  EXPECT_FALSE(lease.lost());  // nothing has asked yet
  ExpectError([&] { lease.verify(); }, ErrorCode::kNotFound, other);
  EXPECT_TRUE(lease.lost());
  ExpectError([&] { lease.verify(); }, ErrorCode::kNotFound, "lost");
}

TEST_F(RedisGpuPoolTest, VerifyWithoutTheServerIsAnEnvironmentErrorAndLosesNothing) {
  GpuPool pool = Pool("hostA", 1, std::nullopt, 30s);
  Lease lease = pool.acquire(Count(1));
  server_.stop();
  ExpectError([&] { lease.verify(); }, ErrorCode::kEnvironment);
  EXPECT_FALSE(lease.lost()) << "not being able to ask is not a loss";
  server_.start();
}

TEST_F(RedisGpuPoolTest, AnUnreachableServerIsAnEnvironmentErrorThatHidesThePassword) {
  const int port = test_support::closed_loopback_port();
  const std::string url =
      "redis://alice:" + std::string(kSecret) + "@127.0.0.1:" + std::to_string(port) + "/0";
  GpuPool pool = Pool("hostA", 1, url);
  for (const std::string& message :
       {ExpectError([&] { pool.acquire(Count(1)); }, ErrorCode::kEnvironment),
        ExpectError([&] { pool.status(); }, ErrorCode::kEnvironment)}) {
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << message;
    EXPECT_NE(message.find("alice:***@"), std::string::npos) << message;
    EXPECT_EQ(message.find(kSecret), std::string::npos) << message;
  }
}

TEST(RedisGpuPoolLoginTest, AWrongPasswordIsRefusedAndTheRightOnesWork) {
  RedisTestServerOptions options;
  options.password = "admin-pw-0";
  options.acl_user = std::make_pair("alice", std::string(kSecret));
  RedisTestServer server(options);
  TempDir temp("redis-login");
  const auto file = temp.path() / "gpus.json";
  std::ofstream(file) << "{\"gpus\": [{\"uuid\": \"" << TestUuid("hostA", 0) << "\"}]}";
  auto pool_for = [&](const std::string& url) {
    PoolOptions o;
    o.backend = url;
    o.pool_name = kPool;
    o.host_name = "hostA";
    o.lease_ttl = 10s;
    o.config = Config{};
    return GpuPool(make_simulated_source_from_file(file.string()), o);
  };

  GpuPool wrong = pool_for(server.url("alice", "Wr0ngPassw0rd"));
  const std::string message =
      ExpectError([&] { wrong.acquire(Count(1)); }, ErrorCode::kEnvironment, "refused the login");
  EXPECT_EQ(message.find("Wr0ngPassw0rd"), std::string::npos) << message;
  GpuPool none = pool_for(server.url());
  ExpectError([&] { none.acquire(Count(1)); }, ErrorCode::kEnvironment);

  // The ACL user, allowed only gpulock:* keys, can lease; so can the default user.
  GpuPool alice = pool_for(server.url("alice", kSecret));
  Lease lease = alice.acquire(Count(1));
  EXPECT_TRUE(lease.active());
  lease.release();
  GpuPool admin = pool_for(server.url("", "admin-pw-0"));
  EXPECT_TRUE(admin.acquire(Count(1)).active());
}

// --- shared leases ------------------------------------------------------------------------

LeaseRequest SharedCount(std::uint64_t gib, std::vector<std::string> hosts = {}) {
  LeaseRequest request = Count(1, std::move(hosts));
  request.memory_bytes = gib << 30;
  return request;
}

TEST_F(RedisGpuPoolTest, ASharedLeaseWhoseGpuIsTakenOverIsLost) {
  GpuPool pool = Pool("hostA", 1, std::nullopt, 900ms);
  Lease lease = pool.acquire(SharedCount(10));
  std::promise<std::string> reason;
  lease.on_lost([&](const std::string& why) { reason.set_value(why); });
  const std::string uuid = lease.gpus().at(0).uuid;
  server_.command({"DEL", keys_.prefix() + "shares:" + uuid});
  server_.command({"SET", keys_.lock(uuid), make_lease_id(), "PX", "60000"});
  auto lost = reason.get_future();
  ASSERT_EQ(lost.wait_for(30s), std::future_status::ready);
  EXPECT_NE(lost.get().find("another lease"), std::string::npos);
  EXPECT_TRUE(lease.lost());
}

TEST_F(RedisGpuPoolTest, VerifyOfASharedLeaseAsksForItsReservation) {
  GpuPool pool = Pool("hostA", 1, std::nullopt, 30s);  // renewals far apart: only verify() asks
  Lease lease = pool.acquire(SharedCount(10));
  Lease other = pool.acquire(SharedCount(10));
  EXPECT_EQ(lease.verify(), lease.fencing_token());
  server_.command({"ZREM", keys_.prefix() + "shares:" + lease.gpus().at(0).uuid, lease.id()});
  ExpectError([&] { lease.verify(); }, ErrorCode::kNotFound, "reservation");
  EXPECT_TRUE(lease.lost());
  EXPECT_EQ(other.verify(), other.fencing_token());
}

TEST_F(RedisGpuPoolTest, ASharedLeaseOnAnotherHostsGpuShowsThereWithItsHolder) {
  GpuPool a = Pool("hostA", 1);
  GpuPool b = Pool("hostB", 1);
  b.status();  // registers hostB's GPU
  Lease lease = a.acquire(SharedCount(30, {"hostB"}));
  EXPECT_EQ(lease.host(), "hostB");
  EXPECT_EQ(lease.gpus().at(0).uuid, TestUuid("hostB", 0));
  Lease local = b.acquire(SharedCount(50));
  ExpectError([&] { a.acquire(SharedCount(1, {"hostB"})); }, ErrorCode::kTimedOut);
  const PoolStatus seen = b.status();
  ASSERT_EQ(seen.gpus.size(), 1u);
  ASSERT_TRUE(seen.gpus[0].shared.has_value());
  EXPECT_EQ(seen.gpus[0].shared->jobs, 2u);
  std::map<std::string, bool> alive;
  for (const auto& h : seen.gpus[0].shared->leases) alive[h.host] = h.holder_alive;
  EXPECT_EQ(alive, (std::map<std::string, bool>{{"hostA", true}, {"hostB", true}}));
}

}  // namespace
}  // namespace gpulock
