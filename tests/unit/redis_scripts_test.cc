// The Redis backend's Lua scripts (redis_scripts.h) run against a real redis-server, their
// contract checked with independent plain commands (GET, HGETALL, PTTL, ...): all-or-nothing
// acquire, compare-and-delete release, renew that never steals, fencing tokens that keep
// increasing when the server loses its data, and garbage in keys that is never trusted and
// never makes a script fail.
#include "redis/redis_scripts.h"
#include "redis/packed_registrations.h"
#include "redis/wake_message.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gpulock/error.hpp"
#include "redis/redis_connection.h"
#include "redis_test_pool.h"
#include "redis_test_server.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using test_support::AcquireArgs;
using test_support::RedisPoolKeys;
using test_support::RedisTestServer;
using test_support::TestUuid;
using test_support::Texts;
using Type = RedisValue::Type;

class RedisScriptsTest : public ::testing::Test {
 protected:
  // -- independent reads, plain commands ------------------------------------------------------
  RedisValue Cmd(const std::vector<std::string>& args) { return server_.command(args); }
  // GET's value, "(nil)" for a missing key, "(error)" for a key of another type.
  std::string Get(const std::string& key) {
    const RedisValue v = Cmd({"GET", key});
    if (v.is_nil()) return "(nil)";
    if (v.is_error()) return "(error)";
    return v.text;
  }
  long long Pttl(const std::string& key) { return Cmd({"PTTL", key}).integer; }
  bool Exists(const std::string& key) { return Cmd({"EXISTS", key}).integer == 1; }
  std::map<std::string, std::string> Hash(const std::string& key) {
    std::map<std::string, std::string> out;
    const RedisValue v = Cmd({"HGETALL", key});
    for (std::size_t i = 0; i + 1 < v.elements.size(); i += 2)
      out[v.elements[i].text] = v.elements[i + 1].text;
    return out;
  }
  std::string Version() { return Get(keys_.version()); }
  long long ServerMs() {
    const RedisValue t = Cmd({"TIME"});
    return std::stoll(t.elements[0].text) * 1000 + std::stoll(t.elements[1].text) / 1000;
  }

  // -- the scripts -----------------------------------------------------------------------------
  RedisValue Register(const std::string& host, unsigned count) {
    return test_support::RegisterHost(*conn_, keys_, host, count);
  }
  RedisValue Acquire(AcquireArgs args) { return test_support::RunAcquire(*conn_, keys_, args); }
  // Acquire of `uuids` ("all") by `id` at the current version; the reply's texts.
  std::vector<std::string> Take(const std::string& id, const std::vector<std::string>& uuids,
                                long long ttl_ms = 60000) {
    AcquireArgs a;
    a.lease_id = id;
    a.ttl_ms = ttl_ms;
    a.expected_version = Version();
    a.needed = static_cast<unsigned>(uuids.size());
    a.candidates = uuids;
    return Texts(Acquire(a));
  }
  RedisValue Release(const std::string& id, const std::vector<std::string>& uuids) {
    std::vector<std::string> args{id};
    args.insert(args.end(), uuids.begin(), uuids.end());
    return conn_->run(redis_scripts::kRelease, {keys_.version()}, args);
  }
  std::vector<std::string> Renew(const std::string& id, long long ttl_ms, const std::string& token,
                                 const std::vector<std::string>& uuids) {
    std::vector<std::string> args{
        id, std::to_string(ttl_ms), token, "{\"renewed\":true}", "tester", "h1"};
    args.insert(args.end(), uuids.begin(), uuids.end());
    return Texts(conn_->run(redis_scripts::kRenew, {keys_.version()}, args));
  }
  // kAcquireShared of `needed` GPUs among `candidates` (each with 320 units of room, 80 GiB)
  // wanting `units` on each; the reply's texts.
  std::vector<std::string> TakeShared(const std::string& id,
                                      const std::vector<std::string>& candidates, unsigned units,
                                      unsigned needed = 1, long long ttl_ms = 60000,
                                      const std::string& cap = "") {
    std::vector<std::string> args{
        id, std::to_string(ttl_ms), "{}", "tester", std::to_string(needed), cap, "0", "0"};
    for (const auto& uuid : candidates) {
      args.push_back(uuid);
      args.push_back("h1");
      args.push_back("320");
      args.push_back(std::to_string(units));
    }
    return Texts(conn_->run(redis_scripts::kAcquireShared, {keys_.version()}, args));
  }
  std::vector<std::string> RenewShared(const std::string& id, long long ttl_ms,
                                       const std::string& token,
                                       const std::vector<std::pair<std::string, unsigned>>& gpus) {
    std::vector<std::string> args{id, std::to_string(ttl_ms), token, "{}", "tester", "h1"};
    for (const auto& [uuid, units] : gpus) {
      args.push_back(uuid);
      args.push_back(std::to_string(units));
    }
    return Texts(conn_->run(redis_scripts::kRenewShared, {keys_.version()}, args));
  }
  // The `shares:` sorted set of a GPU: lease id -> expiry ms, read with plain commands.
  std::map<std::string, long long> Shares(const std::string& uuid) {
    std::map<std::string, long long> out;
    const RedisValue v =
        Cmd({"ZRANGE", keys_.prefix() + "shares:" + uuid, "0", "-1", "WITHSCORES"});
    for (std::size_t i = 0; i + 1 < v.elements.size(); i += 2)
      out[v.elements[i].text] = std::stoll(v.elements[i + 1].text);
    return out;
  }
  RedisValue Snapshot(const std::string& host = "") {
    return conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {host});
  }
  // The seq the entry got (the script replies {seq, whether a given version was unchanged}).
  RedisValue Enter(const std::string& ticket, long long ttl_ms = 60000) {
    return conn_
        ->run(redis_scripts::kEnter, {keys_.version()},
              {ticket, std::to_string(ttl_ms), "{\"body\":1}", "waiter"})
        .elements.at(0);
  }
  // The lock value the snapshot reports for `uuid` ("?" when not listed).
  std::string SnapshotLock(const std::string& uuid) {
    const RedisValue snap = Snapshot();
    const auto& gpus = snap.elements.at(3).elements;
    for (std::size_t i = 0; i + 7 < gpus.size(); i += 8)
      if (gpus[i].text == uuid) return gpus[i + 5].text;
    return "?";
  }

  std::string U(unsigned i) const { return TestUuid("h1", i); }

  RedisTestServer server_;
  std::unique_ptr<RedisConnection> conn_ = server_.connect();
  RedisPoolKeys keys_{"t"};
};

TEST_F(RedisScriptsTest, RegisterThenSnapshotHasTheDocumentedShape) {
  ASSERT_EQ(Register("h1", 2).integer, 1);
  ASSERT_EQ(Register("h2", 1).integer, 1);
  const auto token = Take("lease-a", {U(1)});
  ASSERT_EQ(token.at(0), "ok");
  ASSERT_EQ(Enter("ticket-1").integer, 1);

  const long long before = ServerMs();
  const RedisValue snap = Snapshot();
  const long long after = ServerMs();
  ASSERT_EQ(snap.type, Type::kArray);
  ASSERT_EQ(snap.elements.size(), 11u);
  // version, server time in ms
  EXPECT_EQ(snap.elements[0].text, Version());
  ASSERT_EQ(snap.elements[1].type, Type::kInteger);
  EXPECT_GE(snap.elements[1].integer, before);
  EXPECT_LE(snap.elements[1].integer, after);
  // ... and last, the same moment in microseconds, as text.
  const std::uint64_t server_us = parse_server_us(snap.elements[8].text);
  EXPECT_EQ(static_cast<long long>(server_us / 1000), snap.elements[1].integer)
      << snap.elements[8].text;
  // hosts: {name, registered_at, info, packed registrations}...
  const auto hosts = Texts(snap.elements[2]);
  ASSERT_EQ(hosts.size(), 8u);
  std::set<std::string> names{hosts[0], hosts[4]};
  EXPECT_EQ(names, (std::set<std::string>{"h1", "h2"}));
  const std::size_t h1 = hosts[0] == "h1" ? 0 : 4;
  EXPECT_EQ(hosts[h1 + 2], "{\"test\":true}");
  EXPECT_GT(std::stoll(hosts[h1 + 1]), before - 60000);
  // The package: the read time, then each GPU's UUID and two documents, by UUID.
  const auto packed = unpack_registrations(hosts[h1 + 3]);
  ASSERT_TRUE(packed.has_value()) << hosts[h1 + 3];
  ASSERT_EQ(packed->size(), 2u);
  EXPECT_EQ(packed->at(U(0)).static_json, device_static_json(test_support::TestDevice("h1", 0)));
  EXPECT_EQ(packed->at(U(0)).readings_json,
            device_readings_json(test_support::TestDevice("h1", 0)));
  EXPECT_EQ(packed->at(U(1)).static_json, device_static_json(test_support::TestDevice("h1", 1)));
  const std::string read_at = hosts[h1 + 3].substr(hosts[h1 + 3].find(':') + 1, 13);
  EXPECT_GT(std::stoll(read_at), before - 60000);
  // gpus: {uuid, host, info, readings, read_at, lock, pttl, shares}..., h1's two and h2's one;
  // info, readings and read_at are in the hosts' packages.
  const auto& gpus = snap.elements[3].elements;
  ASSERT_EQ(gpus.size(), 24u);
  std::map<std::string, std::size_t> at;
  for (std::size_t i = 0; i < gpus.size(); i += 8) at[gpus[i].text] = i;
  ASSERT_EQ(at.size(), 3u);
  const std::size_t g0 = at.at(U(0)), g1 = at.at(U(1)), g2 = at.at(TestUuid("h2", 0));
  EXPECT_EQ(gpus[g0 + 1].text, "h1");
  EXPECT_EQ(gpus[g2 + 1].text, "h2");
  EXPECT_EQ(gpus[g0 + 2].text, "");
  EXPECT_EQ(gpus[g0 + 3].text, "");
  EXPECT_EQ(gpus[g0 + 4].text, "");
  EXPECT_EQ(gpus[g0 + 5].text, "");  // free
  EXPECT_EQ(gpus[g0 + 6].integer, -2);
  EXPECT_EQ(gpus[g1 + 5].text, "lease-a");
  EXPECT_EQ(gpus[g1 + 7].text, "");  // no shared leases
  EXPECT_GT(gpus[g1 + 6].integer, 0);
  EXPECT_LE(gpus[g1 + 6].integer, 60000);
  // leases: {id, record, token, pttl, user}... for the leases holding listed GPUs.
  const auto leases = Texts(snap.elements[4]);
  ASSERT_EQ(leases.size(), 5u);
  EXPECT_EQ(leases[0], "lease-a");
  EXPECT_EQ(leases[1], "{}");
  EXPECT_EQ(leases[2], token.at(1));
  EXPECT_GT(std::stoll(leases[3]), 0);
  EXPECT_EQ(leases[4], "tester");  // the lease's user, as the acquire wrote it
  // tickets: {id, seq, body, user, user last served, pttl}...
  const auto tickets = Texts(snap.elements[5]);
  ASSERT_EQ(tickets.size(), 6u);
  EXPECT_EQ(tickets[0], "ticket-1");
  EXPECT_EQ(tickets[1], "1");
  EXPECT_EQ(tickets[2], "{\"body\":1}");
  EXPECT_EQ(tickets[3], "waiter");
  EXPECT_EQ(tickets[4], "");  // never served
  EXPECT_GT(snap.elements[5].elements[5].integer, 0);
  EXPECT_LE(snap.elements[5].elements[5].integer, 60000);

  // elsewhere: nothing for a whole-pool snapshot; whole: 1.
  EXPECT_EQ(snap.elements[6].elements.size(), 0u);
  EXPECT_EQ(snap.elements[7].integer, 1);

  // A ticket that may use any host widens every scope to the whole pool.
  EXPECT_EQ(Snapshot("h2\n").elements[7].integer, 1);
  // Once it is gone, a scope lists its hosts and their GPUs only (the queue is the pool's), and
  // counts the GPUs the user asking holds elsewhere.
  conn_->run(redis_scripts::kLeave, {keys_.version()}, {"ticket-1"});
  const RedisValue only_h2 =
      conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "tester"});
  EXPECT_EQ(Texts(only_h2.elements[2]).at(0), "h2");
  EXPECT_EQ(only_h2.elements[2].elements.size(), 4u);
  EXPECT_EQ(only_h2.elements[3].elements.size(), 8u);
  EXPECT_EQ(only_h2.elements[4].elements.size(), 0u);
  EXPECT_EQ(only_h2.elements[5].elements.size(), 0u);
  EXPECT_EQ(Texts(only_h2.elements[6]), (std::vector<std::string>{"tester", "1", ""}));
  EXPECT_EQ(only_h2.elements[7].integer, 0);
  // A ticket limited to h1 widens a scope of h2 by h1 only.
  conn_->run(redis_scripts::kEnter, {keys_.version()},
             {"ticket-2", "60000", "{\"body\":1}", "waiter", "h1\n"});
  const RedisValue widened = Snapshot("h2\n");
  EXPECT_EQ(widened.elements[2].elements.size(), 8u);
  EXPECT_EQ(widened.elements[3].elements.size(), 24u);
  EXPECT_EQ(widened.elements[7].integer, 0);
  // An unknown host in a scope is not listed (h1 is, for the ticket).
  EXPECT_EQ(Texts(Snapshot("nowhere\n").elements[2]).at(0), "h1");
  EXPECT_EQ(Snapshot("nowhere\n").elements[2].elements.size(), 4u);
}

// A host without packed registrations (registered by an older gpulock, or whose GPU another host
// took since), or with a stale package, has its GPUs read one by one, each only while it still
// names that host.
TEST_F(RedisScriptsTest, AHostWithoutPackedRegistrationsIsReadGpuByGpu) {
  ASSERT_EQ(Register("h1", 2).integer, 1);
  ASSERT_EQ(Register("h2", 1).integer, 1);
  Cmd({"HDEL", keys_.prefix() + "host:h1", "gpus"});
  RedisValue snap = Snapshot();
  auto gpu_fields = [&](const RedisValue& s, const std::string& uuid, const std::string& host) {
    const auto& gpus = s.elements.at(3).elements;
    for (std::size_t i = 0; i + 7 < gpus.size(); i += 8)
      if (gpus[i].text == uuid && gpus[i + 1].text == host)
        return std::vector<std::string>{gpus[i + 2].text, gpus[i + 3].text};
    return std::vector<std::string>{};
  };
  EXPECT_EQ(gpu_fields(snap, U(0), "h1"),
            (std::vector<std::string>{device_static_json(test_support::TestDevice("h1", 0)),
                                      device_readings_json(test_support::TestDevice("h1", 0))}));
  // A package older than the host's last registration (an older gpulock registered since, and
  // left the package as it was) is stale: its GPUs are read one by one too.
  Register("h1", 2);
  EXPECT_EQ(gpu_fields(Snapshot(), U(0), "h1"), (std::vector<std::string>{"", ""}));
  Cmd({"HSET", keys_.prefix() + "host:h1", "registered_at", "1"});
  EXPECT_EQ(gpu_fields(Snapshot(), U(0), "h1").at(0),
            device_static_json(test_support::TestDevice("h1", 0)));
  // h2 now lists h1's GPU 0 as its own (a UUID moved): h1's package would still list it, so
  // h2's registration removes it, and h1's snapshot no longer shows the GPU under h1.
  Register("h1", 2);
  ASSERT_FALSE(Hash(keys_.prefix() + "host:h1")["gpus"].empty());
  std::vector<std::string> args{"h2", "{\"test\":true}"};
  for (const auto& device :
       {test_support::TestDevice("h2", 0), test_support::TestDevice("h1", 0)}) {
    args.push_back(device.uuid);
    args.push_back(device_static_json(device));
    args.push_back(device_readings_json(device));
  }
  conn_->run(redis_scripts::kRegister, {keys_.version()}, args);
  EXPECT_EQ(Hash(keys_.prefix() + "host:h1").count("gpus"), 0u);
  snap = Snapshot();
  EXPECT_TRUE(gpu_fields(snap, U(0), "h1").empty());
  EXPECT_EQ(gpu_fields(snap, U(1), "h1").size(), 2u);
  EXPECT_EQ(gpu_fields(snap, U(0), "h2"), (std::vector<std::string>{"", ""}));  // h2's package
}

// A host's request reads that host's keys: the cost of a scoped snapshot does not grow with
// the hosts outside it, and GPUs held there count through the users' `held:` sets.
TEST_F(RedisScriptsTest, AScopedSnapshotCountsGpusHeldElsewhere) {
  Register("h1", 2);
  Register("h2", 2);
  AcquireArgs a;
  a.lease_id = "far";
  a.expected_version = Version();
  a.needed = 2;
  a.host = "h2";
  a.candidates = {TestUuid("h2", 0), TestUuid("h2", 1)};
  ASSERT_EQ(Texts(Acquire(a)).at(0), "ok");
  EXPECT_EQ(Cmd({"ZCARD", keys_.prefix() + "held:tester"}).integer, 1);
  const RedisValue snap =
      conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h1\n", "tester"});
  EXPECT_EQ(snap.elements[3].elements.size(), 16u);  // h1's two GPUs only
  EXPECT_EQ(Texts(snap.elements[6]), (std::vector<std::string>{"tester", "2", ""}));
  // A lease that expired counts no more, and leaves the set.
  Cmd({"ZADD", keys_.prefix() + "held:tester", "1", "far"});
  const RedisValue later =
      conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h1\n", "tester"});
  EXPECT_EQ(later.elements[6].elements.size(), 0u);
  EXPECT_EQ(Cmd({"ZCARD", keys_.prefix() + "held:tester"}).integer, 0);
  // A renewal puts it back; a release takes it out.
  Renew("far", 60000, "5", {TestUuid("h2", 0), TestUuid("h2", 1)});
  EXPECT_EQ(Cmd({"ZCARD", keys_.prefix() + "held:tester"}).integer, 1);
  Release("far", {});
  EXPECT_EQ(Cmd({"ZCARD", keys_.prefix() + "held:tester"}).integer, 0);
}

TEST_F(RedisScriptsTest, RegisterBumpsTheVersionOnlyWhenTheStaticInformationChanges) {
  EXPECT_EQ(Version(), "(nil)");
  EXPECT_EQ(Snapshot().elements.at(0).text, "0");  // no version yet reads as "0"
  EXPECT_EQ(Register("h1", 2).integer, 1);
  const std::string v1 = Version();
  EXPECT_EQ(Register("h1", 2).integer, 0);
  EXPECT_EQ(Version(), v1);
  EXPECT_EQ(Cmd({"SMEMBERS", keys_.prefix() + "gpus:h1"}).elements.size(), 2u);
  EXPECT_EQ(Hash(keys_.gpu(U(0)))["host"], "h1");
  // One GPU fewer: it leaves the host's set and its hash goes.
  EXPECT_EQ(Register("h1", 1).integer, 1);
  EXPECT_NE(Version(), v1);
  EXPECT_EQ(Cmd({"SMEMBERS", keys_.prefix() + "gpus:h1"}).elements.size(), 1u);
  EXPECT_FALSE(Exists(keys_.gpu(U(1))));
  EXPECT_TRUE(Exists(keys_.gpu(U(0))));
  EXPECT_EQ(Cmd({"ZSCORE", keys_.hosts(), "h1"}).type, Type::kString);
}

TEST_F(RedisScriptsTest, AcquireAllTakesEveryCandidateOrNone) {
  Register("h1", 4);
  ASSERT_EQ(Cmd({"SET", keys_.lock(U(2)), "someone-else"}).text, "OK");
  const std::string version = Version();
  const std::string token_before = Get(keys_.token());

  AcquireArgs a;
  a.lease_id = "lease-all";
  a.expected_version = version;
  a.limited = true;  // so that taking GPUs moves the version
  a.needed = 4;
  a.candidates = {U(0), U(1), U(2), U(3)};
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"busy"});
  for (unsigned i : {0u, 1u, 3u}) EXPECT_FALSE(Exists(keys_.lock(U(i)))) << i;
  EXPECT_EQ(Get(keys_.lock(U(2))), "someone-else");
  EXPECT_FALSE(Exists(keys_.lease("lease-all")));
  EXPECT_EQ(Get(keys_.token()), token_before);
  EXPECT_EQ(Version(), version);

  // "any" with more needed than are free: none either.
  a.mode = "any";
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"busy"});
  for (unsigned i : {0u, 1u, 3u}) EXPECT_FALSE(Exists(keys_.lock(U(i)))) << i;

  // Once it is free, all four at once.
  Cmd({"DEL", keys_.lock(U(2))});
  a.mode = "all";
  const auto ok = Texts(Acquire(a));
  ASSERT_EQ(ok.size(), 6u);
  EXPECT_EQ(ok[0], "ok");
  EXPECT_EQ(std::vector<std::string>(ok.begin() + 2, ok.end()),
            (std::vector<std::string>{U(0), U(1), U(2), U(3)}));
  for (unsigned i = 0; i < 4; ++i) EXPECT_EQ(Get(keys_.lock(U(i))), "lease-all");
  EXPECT_NE(Version(), version);
}

TEST_F(RedisScriptsTest, AcquireAnyTakesTheFirstFreeCandidatesInOrder) {
  Register("h1", 4);
  Cmd({"SET", keys_.lock(U(3)), "x"});
  AcquireArgs a;
  a.lease_id = "lease-any";
  a.expected_version = Version();
  a.needed = 2;
  a.mode = "any";
  a.candidates = {U(3), U(1), U(0), U(2)};
  const auto ok = Texts(Acquire(a));
  ASSERT_EQ(ok.size(), 4u);
  EXPECT_EQ(ok[0], "ok");
  EXPECT_EQ(ok[2], U(1));
  EXPECT_EQ(ok[3], U(0));
  EXPECT_FALSE(Exists(keys_.lock(U(2))));
  EXPECT_EQ(Hash(keys_.lease("lease-any"))["gpus"], U(1) + "," + U(0));
}

TEST_F(RedisScriptsTest, AcquireWritesTheLockTheLeaseAndTheServedMark) {
  Register("h1", 2);
  AcquireArgs a;
  a.lease_id = "lease-w";
  a.ttl_ms = 5000;
  a.expected_version = Version();
  a.record = "{\"lease_id\":\"lease-w\"}";
  a.user = "alice";
  a.host = "h1";
  a.candidates = {U(0)};
  const auto ok = Texts(Acquire(a));
  ASSERT_EQ(ok.at(0), "ok");
  EXPECT_EQ(Get(keys_.lock(U(0))), "lease-w");
  EXPECT_GT(Pttl(keys_.lock(U(0))), 0);
  EXPECT_LE(Pttl(keys_.lock(U(0))), 5000);
  const auto lease = Hash(keys_.lease("lease-w"));
  EXPECT_EQ(lease.at("record"), a.record);
  EXPECT_EQ(lease.at("token"), ok[1]);
  EXPECT_EQ(lease.at("gpus"), U(0));
  EXPECT_EQ(lease.at("user"), "alice");
  EXPECT_EQ(lease.at("host"), "h1");
  EXPECT_GT(Pttl(keys_.lease("lease-w")), 0);
  EXPECT_LE(Pttl(keys_.lease("lease-w")), 5000);
  EXPECT_EQ(Get(keys_.token()), ok[1]);
  EXPECT_NE(Get(keys_.prefix() + "served:alice"), "(nil)");
  EXPECT_GT(Pttl(keys_.prefix() + "served:alice"), 29LL * 24 * 3600 * 1000);

  // The same lease id cannot take more GPUs.
  a.candidates = {U(1)};
  a.expected_version = Version();
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"busy"});
  EXPECT_FALSE(Exists(keys_.lock(U(1))));
}

TEST_F(RedisScriptsTest, AGpuThatIsNotRegisteredIsNeverTaken) {
  Register("h1", 1);
  AcquireArgs a;
  a.lease_id = "lease-u";
  a.expected_version = Version();
  a.candidates = {TestUuid("nowhere", 0)};
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"busy"});
  EXPECT_FALSE(Exists(keys_.lock(TestUuid("nowhere", 0))));
  // "any" skips it for a registered one.
  a.mode = "any";
  a.candidates = {TestUuid("nowhere", 0), U(0)};
  const auto ok = Texts(Acquire(a));
  ASSERT_EQ(ok.size(), 3u);
  EXPECT_EQ(ok[2], U(0));
}

TEST_F(RedisScriptsTest, AcquireWithAStaleVersionIsRefused) {
  Register("h1", 2);
  const std::string version = Version();
  AcquireArgs a;
  a.lease_id = "lease-s";
  a.expected_version = std::to_string(std::stoll(version) + 1);
  a.candidates = {U(0)};
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"stale"});
  a.expected_version = "not-a-version";
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"stale"});
  EXPECT_FALSE(Exists(keys_.lock(U(0))));
  EXPECT_EQ(Version(), version);
  // While someone waits, another acquire moves the version: the old one is stale now.
  Enter("someone");
  const std::string waiting = Version();
  ASSERT_EQ(Take("other", {U(1)}).at(0), "ok");
  a.expected_version = waiting;
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"stale"});
  EXPECT_FALSE(Exists(keys_.lock(U(0))));
}

// A connection that lost an acquire's answer sends it again: the same lease id (random, one per
// attempt) finds its own lease and gets the first run's answer, even at a version it made stale,
// rather than "busy" with its own first run's lock on the GPU; no second token is spent.
TEST_F(RedisScriptsTest, AnAcquireSentAgainGetsItsFirstAnswer) {
  Register("h1", 2);
  Enter("someone");  // an acquire then moves the version: the same request again is stale
  AcquireArgs a;
  a.lease_id = "lease-again";
  a.expected_version = Version();
  a.candidates = {U(0)};
  const std::vector<std::string> first = Texts(Acquire(a));
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(first.at(0), "ok");
  const std::string token = Get(keys_.prefix() + "token");
  EXPECT_NE(Version(), a.expected_version);
  EXPECT_EQ(Texts(Acquire(a)), first);
  EXPECT_EQ(Get(keys_.prefix() + "token"), token);
  EXPECT_EQ(Get(keys_.lock(U(0))), "lease-again");
  EXPECT_FALSE(Exists(keys_.lock(U(1))));
  // A shared acquire sent again: its GPUs and units, one reservation.
  const auto shared = TakeShared("lease-shared-again", {U(1)}, 40);
  ASSERT_EQ(shared.at(0), "queue");  // no shared lease starts while a ticket waits
  Cmd({"DEL", keys_.prefix() + "queue"});
  const auto taken = TakeShared("lease-shared-again", {U(1)}, 40);
  ASSERT_EQ(taken, (std::vector<std::string>{"ok", taken.at(1), U(1), "40"}));
  EXPECT_EQ(TakeShared("lease-shared-again", {U(1)}, 40), taken);
  EXPECT_EQ(Shares(U(1)).size(), 1u);
  // Another id is refused as before.
  EXPECT_EQ(Take("lease-other", {U(0)}), (std::vector<std::string>{"busy"}));
}

// Plans depend on the free GPUs only through the queue (and limits): with nobody waiting, an
// acquire or release elsewhere in the pool leaves the version, so concurrent requests on other
// hosts do not make each other plan again.
TEST_F(RedisScriptsTest, TheVersionMovesOnlyWhenAPlanCouldDependOnTheChange) {
  Register("h1", 3);
  const std::string quiet = Version();
  const auto ok = Take("a", {U(0)});
  ASSERT_EQ(ok.at(0), "ok");
  EXPECT_EQ(Version(), quiet);
  EXPECT_EQ(Release("a", {U(0)}).integer, 1);
  EXPECT_EQ(Version(), quiet);
  // A limit applies: the acquire moves it.
  AcquireArgs a;
  a.lease_id = "b";
  a.expected_version = quiet;
  a.limited = true;
  a.candidates = {U(1)};
  ASSERT_EQ(Texts(Acquire(a)).at(0), "ok");
  EXPECT_NE(Version(), quiet);
  // Someone waits: acquires and releases move it.
  Enter("w");
  std::string v = Version();
  ASSERT_EQ(Take("c", {U(2)}).at(0), "ok");
  EXPECT_NE(Version(), v);
  v = Version();
  Release("c", {U(2)});
  EXPECT_NE(Version(), v);
}

TEST_F(RedisScriptsTest, AMissingVersionKeyReadsAsZero) {
  Register("h1", 1);
  Cmd({"DEL", keys_.version()});
  AcquireArgs a;
  a.lease_id = "lease-0";
  a.expected_version = "1";
  a.candidates = {U(0)};
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"stale"});
  a.expected_version = "0";
  a.limited = true;
  EXPECT_EQ(Texts(Acquire(a)).at(0), "ok");
  EXPECT_EQ(Version(), "1");
}

TEST_F(RedisScriptsTest, AcquireWithoutAVersionDefersToALiveTicket) {
  Register("h1", 2);
  Cmd({"ZADD", keys_.queue(), "1", "waiting"});
  Cmd({"HSET", keys_.ticket("waiting"), "body", "{}", "user", "w"});
  Cmd({"PEXPIRE", keys_.ticket("waiting"), "60000"});
  AcquireArgs a;
  a.lease_id = "lease-q";
  a.expected_version = "";
  a.candidates = {U(0)};
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"queue"});
  EXPECT_FALSE(Exists(keys_.lock(U(0))));
  EXPECT_EQ(Cmd({"ZSCORE", keys_.queue(), "waiting"}).type, Type::kString);

  // A member whose ticket expired (a dead waiter) does not count, and leaves the queue.
  Cmd({"DEL", keys_.ticket("waiting")});
  const auto ok = Texts(Acquire(a));
  EXPECT_EQ(ok.at(0), "ok");
  EXPECT_TRUE(Cmd({"ZSCORE", keys_.queue(), "waiting"}).is_nil());
}

TEST_F(RedisScriptsTest, AcquireForATicketRemovesItFromTheQueue) {
  Register("h1", 1);
  ASSERT_EQ(Enter("tk").integer, 1);
  EXPECT_TRUE(Exists(keys_.ticket("tk")));
  AcquireArgs a;
  a.lease_id = "lease-t";
  a.expected_version = Version();
  a.ticket = "tk";
  a.candidates = {U(0)};
  EXPECT_EQ(Texts(Acquire(a)).at(0), "ok");
  EXPECT_FALSE(Exists(keys_.ticket("tk")));
  EXPECT_TRUE(Cmd({"ZSCORE", keys_.queue(), "tk"}).is_nil());
}

TEST_F(RedisScriptsTest, EnterAndLeaveTheQueue) {
  EXPECT_EQ(Enter("a").integer, 1);
  EXPECT_EQ(Enter("b", 5000).integer, 2);
  EXPECT_EQ(Cmd({"ZSCORE", keys_.queue(), "b"}).text, "2");
  EXPECT_EQ(Hash(keys_.ticket("b"))["user"], "waiter");
  EXPECT_GT(Pttl(keys_.ticket("b")), 0);
  EXPECT_LE(Pttl(keys_.ticket("b")), 5000);
  const std::string version = Version();
  conn_->run(redis_scripts::kLeave, {keys_.version()}, {"a"});
  EXPECT_TRUE(Cmd({"ZSCORE", keys_.queue(), "a"}).is_nil());
  EXPECT_FALSE(Exists(keys_.ticket("a")));
  EXPECT_NE(Version(), version);
  // Leaving twice is harmless.
  EXPECT_NO_THROW(conn_->run(redis_scripts::kLeave, {keys_.version()}, {"a"}));
}

// An entry sent again after its answer was lost (the same random ticket id, its ticket live)
// keeps its place; a ticket whose key expired (its waiter stopped renewing) joins at the back.
TEST_F(RedisScriptsTest, AnEntrySentAgainKeepsItsPlace) {
  EXPECT_EQ(Enter("a").integer, 1);
  EXPECT_EQ(Enter("b").integer, 2);
  EXPECT_EQ(Enter("a").integer, 1);
  EXPECT_EQ(Cmd({"ZSCORE", keys_.queue(), "a"}).text, "1");
  Cmd({"DEL", keys_.ticket("a")});
  EXPECT_EQ(Enter("a").integer, 3);
  EXPECT_EQ(Cmd({"ZSCORE", keys_.queue(), "a"}).text, "3");
}

// A snapshot reports each ticket's TTL from its expires_at field (set by enter and heartbeat with
// the key's expiry), and asks PTTL when that is missing, past, or not a plausible time (a ticket
// renewed by an older gpulock, or garbage).
TEST_F(RedisScriptsTest, ATicketsTtlIsReadFromItsExpiryAndAskedWhenThatIsNotPlausible) {
  Enter("ticket-1", 5000);
  const auto ttl_of = [&] {
    const RedisValue snap = Snapshot();
    return snap.elements.at(5).elements.at(5).integer;
  };
  const long long key_ttl = Pttl(keys_.ticket("ticket-1"));
  EXPECT_GT(ttl_of(), 0);
  EXPECT_LE(ttl_of(), 5000);
  EXPECT_LE(std::abs(ttl_of() - key_ttl), 50);
  // The heartbeat moves both.
  conn_->run(redis_scripts::kHeartbeat, {keys_.version()}, {"ticket-1", "40000"});
  EXPECT_GT(ttl_of(), 30000);
  const long long at = std::stoll(Hash(keys_.ticket("ticket-1")).at("expires_at"));
  EXPECT_LE(std::abs(at - ServerMs() - Pttl(keys_.ticket("ticket-1"))), 50);
  // An older gpulock's heartbeat extends the key only: expires_at is past, PTTL is asked.
  for (const char* bad : {"1", "junk", "1e400", "99999999999999999"}) {
    Cmd({"HSET", keys_.ticket("ticket-1"), "expires_at", bad});
    Cmd({"PEXPIRE", keys_.ticket("ticket-1"), "20000"});
    EXPECT_GT(ttl_of(), 15000) << bad;
    EXPECT_LE(ttl_of(), 20000) << bad;
  }
  // One in the near future (stale but plausible) is taken: never later than the key's expiry
  // when gpulock wrote it, at worst earlier (a waiter then looks again sooner).
  Cmd({"HSET", keys_.ticket("ticket-1"), "expires_at", std::to_string(ServerMs() + 1000)});
  EXPECT_LE(ttl_of(), 1000);
}

TEST_F(RedisScriptsTest, SnapshotDropsTicketsThatExpired) {
  Enter("alive");
  Cmd({"ZADD", keys_.queue(), "7", "dead"});  // its ticket hash is gone
  const std::string version = Version();
  const auto tickets = Texts(Snapshot().elements.at(5));
  ASSERT_EQ(tickets.size(), 6u);
  EXPECT_EQ(tickets[0], "alive");
  EXPECT_TRUE(Cmd({"ZSCORE", keys_.queue(), "dead"}).is_nil());
  EXPECT_NE(Version(), version);
}

TEST_F(RedisScriptsTest, ReleaseIsCompareAndDelete) {
  Register("h1", 2);
  ASSERT_EQ(Take("lease-r", {U(0), U(1)}).at(0), "ok");
  // GPU 1's lock went to another lease (as after an expiry).
  Cmd({"SET", keys_.lock(U(1)), "lease-other", "PX", "60000"});
  Enter("waiting");  // so that a release moves the version
  const std::string version = Version();
  const RedisValue released = Release("lease-r", {U(0), U(1)});
  EXPECT_EQ(released.integer, 1);
  EXPECT_FALSE(Exists(keys_.lock(U(0))));
  EXPECT_EQ(Get(keys_.lock(U(1))), "lease-other");
  EXPECT_FALSE(Exists(keys_.lease("lease-r")));
  EXPECT_EQ(Get(keys_.ended("lease-r")), "1");
  // Two of the lease's TTLs (Take() leases for 60 s): long enough for any renewal to see it.
  EXPECT_GT(Pttl(keys_.ended("lease-r")), 60000);
  EXPECT_LE(Pttl(keys_.ended("lease-r")), 120000);
  EXPECT_NE(Version(), version);

  // Releasing again changes nothing and says so.
  const std::string after = Version();
  EXPECT_EQ(Release("lease-r", {U(0), U(1)}).integer, 0);
  EXPECT_EQ(Get(keys_.lock(U(1))), "lease-other");
  EXPECT_EQ(Version(), after);
  // Releasing a lease that never existed too.
  EXPECT_EQ(Release("never", {U(1)}).integer, 0);
  EXPECT_EQ(Get(keys_.lock(U(1))), "lease-other");
}

TEST_F(RedisScriptsTest, ReleaseWithoutUuidsUsesTheLeaseRecord) {
  Register("h1", 3);
  ASSERT_EQ(Take("lease-c", {U(1), U(2)}).at(0), "ok");
  EXPECT_EQ(Release("lease-c", {}).integer, 2);
  EXPECT_FALSE(Exists(keys_.lock(U(1))));
  EXPECT_FALSE(Exists(keys_.lock(U(2))));
  EXPECT_EQ(Release("lease-c", {}).integer, 0);
}

TEST_F(RedisScriptsTest, ScriptsPublishEvents) {
  Register("h1", 1);
  auto subscriber = server_.connect();
  subscriber->subscribe(keys_.events());
  Enter("tk");  // waiters are whom events are for
  // Each script that writes publishes first (so that a user refused the channel fails before
  // writing anything), and again with its change.
  EXPECT_EQ(subscriber->next_message(std::chrono::seconds(10)), "entering");
  EXPECT_EQ(subscriber->next_message(std::chrono::seconds(10)), "enter");
  ASSERT_EQ(Take("lease-e", {U(0)}).at(0), "ok");
  EXPECT_EQ(subscriber->next_message(std::chrono::seconds(10)), "acquiring");
  EXPECT_EQ(subscriber->next_message(std::chrono::seconds(10)), "acquire");
  Release("lease-e", {U(0)});
  EXPECT_EQ(subscriber->next_message(std::chrono::seconds(10)), "releasing");
  EXPECT_EQ(subscriber->next_message(std::chrono::seconds(10)), "release");
}

TEST_F(RedisScriptsTest, RenewExtendsTheTtl) {
  Register("h1", 2);
  const auto ok = Take("lease-n", {U(0), U(1)}, 3000);
  ASSERT_EQ(ok.at(0), "ok");
  ASSERT_LE(Pttl(keys_.lock(U(0))), 3000);
  const std::string version = Version();
  EXPECT_EQ(Renew("lease-n", 600000, ok[1], {U(0), U(1)}), std::vector<std::string>{"ok"});
  for (unsigned i = 0; i < 2; ++i) {
    EXPECT_GT(Pttl(keys_.lock(U(i))), 500000) << i;
    EXPECT_EQ(Get(keys_.lock(U(i))), "lease-n");
  }
  EXPECT_GT(Pttl(keys_.lease("lease-n")), 500000);
  EXPECT_EQ(Hash(keys_.lease("lease-n"))["record"], "{\"renewed\":true}");
  EXPECT_EQ(Version(), version);  // a plain renewal changes nothing others plan on
}

TEST_F(RedisScriptsTest, RenewRestoresTheKeysAfterTheServerLostThem) {
  Register("h1", 2);
  const auto ok = Take("lease-f", {U(0), U(1)});
  ASSERT_EQ(ok.at(0), "ok");
  ASSERT_EQ(Cmd({"FLUSHALL"}).text, "OK");
  EXPECT_EQ(Renew("lease-f", 20000, ok[1], {U(0), U(1)}), std::vector<std::string>{"restored"});
  for (unsigned i = 0; i < 2; ++i) {
    EXPECT_EQ(Get(keys_.lock(U(i))), "lease-f") << i;
    EXPECT_GT(Pttl(keys_.lock(U(i))), 0) << i;
    EXPECT_LE(Pttl(keys_.lock(U(i))), 20000) << i;
  }
  const auto lease = Hash(keys_.lease("lease-f"));
  EXPECT_EQ(lease.at("token"), ok[1]);
  EXPECT_EQ(lease.at("gpus"), U(0) + "," + U(1));
  EXPECT_GT(Pttl(keys_.lease("lease-f")), 0);
  EXPECT_EQ(Get(keys_.token()), ok[1]);
  EXPECT_NE(Version(), "(nil)");
  // The next renewal finds everything in place.
  EXPECT_EQ(Renew("lease-f", 20000, ok[1], {U(0), U(1)}), std::vector<std::string>{"ok"});
}

TEST_F(RedisScriptsTest, RenewReportsLostWhenAnotherLeaseHoldsAGpuAndStealsNothing) {
  Register("h1", 2);
  const auto ok = Take("lease-l", {U(0), U(1)}, 4000);
  ASSERT_EQ(ok.at(0), "ok");
  Cmd({"SET", keys_.lock(U(1)), "lease-thief"});
  EXPECT_EQ(Renew("lease-l", 600000, ok[1], {U(0), U(1)}),
            (std::vector<std::string>{"lost", U(1), "lease-thief"}));
  EXPECT_EQ(Get(keys_.lock(U(1))), "lease-thief");
  EXPECT_EQ(Pttl(keys_.lock(U(1))), -1);
  // Nothing was extended either.
  EXPECT_LE(Pttl(keys_.lock(U(0))), 4000);
  EXPECT_LE(Pttl(keys_.lease("lease-l")), 4000);

  // Also when the lost GPU's lock is the only one left (the others expired).
  Cmd({"DEL", keys_.lock(U(0))});
  EXPECT_EQ(Renew("lease-l", 600000, ok[1], {U(0), U(1)}).at(0), "lost");
  EXPECT_FALSE(Exists(keys_.lock(U(0))));
}

TEST_F(RedisScriptsTest, RenewAfterAReleaseReportsReleasedAndRestoresNothing) {
  Register("h1", 2);
  const auto ok = Take("lease-x", {U(0), U(1)});
  ASSERT_EQ(ok.at(0), "ok");
  EXPECT_EQ(Release("lease-x", {}).integer, 2);
  EXPECT_EQ(Renew("lease-x", 60000, ok[1], {U(0), U(1)}),
            (std::vector<std::string>{"lost", "", "released"}));
  EXPECT_FALSE(Exists(keys_.lock(U(0))));
  EXPECT_FALSE(Exists(keys_.lock(U(1))));
  EXPECT_FALSE(Exists(keys_.lease("lease-x")));
}

TEST_F(RedisScriptsTest, RenewRaisesTheTokenCounterToItsOwnToken) {
  Register("h1", 1);
  const auto ok = Take("lease-k", {U(0)});
  ASSERT_EQ(ok.at(0), "ok");
  Cmd({"SET", keys_.token(), "5"});
  EXPECT_EQ(Renew("lease-k", 60000, ok[1], {U(0)}).at(0), "ok");
  EXPECT_EQ(Get(keys_.token()), ok[1]);
  // A counter above the lease's token is left alone.
  const std::string higher = std::to_string(std::stoull(ok[1]) + 1000);
  Cmd({"SET", keys_.token(), higher});
  EXPECT_EQ(Renew("lease-k", 60000, ok[1], {U(0)}).at(0), "ok");
  EXPECT_EQ(Get(keys_.token()), higher);
  // A counter that is garbage is replaced.
  Cmd({"DEL", keys_.token()});
  Cmd({"HSET", keys_.token(), "a", "b"});
  EXPECT_EQ(Renew("lease-k", 60000, ok[1], {U(0)}).at(0), "ok");
  EXPECT_EQ(Get(keys_.token()), ok[1]);
}

TEST_F(RedisScriptsTest, FencingTokensStrictlyIncrease) {
  Register("h1", 2);
  std::uint64_t last = 0;
  for (int i = 0; i < 60; ++i) {
    const std::string id = "lease-" + std::to_string(i);
    const auto ok = Take(id, {U(i % 2)});
    ASSERT_EQ(ok.at(0), "ok") << i;
    const std::uint64_t token = std::stoull(ok[1]);
    EXPECT_GT(token, last) << i;
    EXPECT_EQ(Get(keys_.token()), ok[1]);
    last = token;
    if (i % 3 != 0)
      ASSERT_EQ(Release(id, {}).integer, 1);
    else
      Cmd({"DEL", keys_.lock(U(i % 2))});  // as if it expired
  }
}

TEST_F(RedisScriptsTest, FencingTokensKeepIncreasingWhenTheServerLosesItsData) {
  Register("h1", 1);
  unsigned long long highest = 0;
  for (int i = 0; i < 20; ++i) {
    const auto ok = Take("before-" + std::to_string(i), {U(0)});
    ASSERT_EQ(ok.at(0), "ok");
    highest = std::max(highest, std::stoull(ok[1]));
    Release("before-" + std::to_string(i), {});
  }
  // FLUSHALL: the token counter is gone.
  ASSERT_EQ(Cmd({"FLUSHALL"}).text, "OK");
  ASSERT_EQ(Get(keys_.token()), "(nil)");
  Register("h1", 1);
  const auto flushed = Take("after-flush", {U(0)});
  ASSERT_EQ(flushed.at(0), "ok");
  EXPECT_GT(std::stoull(flushed[1]), highest);
  highest = std::stoull(flushed[1]);

  // A restart without persistence: everything is gone, scripts included.
  server_.restart();
  conn_ = server_.connect();
  ASSERT_EQ(Get(keys_.token()), "(nil)");
  Register("h1", 1);
  const auto restarted = Take("after-restart", {U(0)});
  ASSERT_EQ(restarted.at(0), "ok");
  EXPECT_GT(std::stoull(restarted[1]), highest);
}

TEST_F(RedisScriptsTest, ATokenCounterHoldingGarbageDoesNotStopAcquire) {
  Register("h1", 2);
  const auto first = Take("lease-1", {U(0)});
  ASSERT_EQ(first.at(0), "ok");
  Cmd({"DEL", keys_.token()});
  Cmd({"HSET", keys_.token(), "x", "y"});
  const auto second = Take("lease-2", {U(1)});
  ASSERT_EQ(second.at(0), "ok");
  EXPECT_GT(std::stoull(second[1]), std::stoull(first[1]));
  EXPECT_EQ(Get(keys_.token()), second[1]);
  Cmd({"SET", keys_.token(), "not a number"});
  Release("lease-1", {});
  const auto third = Take("lease-3", {U(0)});
  ASSERT_EQ(third.at(0), "ok");
  EXPECT_GT(std::stoull(third[1]), std::stoull(second[1]));
}

// Tokens are decimal text in the scripts, never Lua numbers (doubles): exact to 2^64 - 1.
TEST_F(RedisScriptsTest, FencingTokensAreExactOverTheWhole64BitRange) {
  Register("h1", 2);
  int n = 0;
  for (const std::uint64_t start : {std::uint64_t{1} << 53, (std::uint64_t{1} << 53) + 1,
                                    (std::uint64_t{1} << 63) - 1, ~std::uint64_t{0} - 2}) {
    Cmd({"SET", keys_.token(), std::to_string(start)});
    Cmd({"DEL", keys_.token_copy()});  // else tokens go on from the previous round's
    std::uint64_t last = start;
    for (int i = 0; i < 2; ++i, ++n) {
      const std::string id = "lease-" + std::to_string(n);
      const auto ok = Take(id, {U(i)});
      ASSERT_EQ(ok.at(0), "ok") << start;
      EXPECT_EQ(ok[1], std::to_string(last + 1)) << start;
      EXPECT_EQ(Get(keys_.token()), ok[1]);
      EXPECT_EQ(Get(keys_.token_copy()), ok[1]);
      EXPECT_EQ(Hash(keys_.lease(id)).at("token"), ok[1]);
      last = std::stoull(ok[1]);
    }
    Release("lease-" + std::to_string(n - 2), {});
    Release("lease-" + std::to_string(n - 1), {});
  }
  EXPECT_EQ(Get(keys_.token()), "18446744073709551615");  // 2^64 - 1, the last one
}

TEST_F(RedisScriptsTest, NoTokenAfterTheLastOneAndNothingWritten) {
  Register("h1", 1);
  // The reply names the key that holds the last token.
  for (const auto& [token, copy, holder] :
       std::vector<std::array<std::string, 3>>{{"18446744073709551615", "", "token"},
                                               {"12", "18446744073709551615", "token_copy"},
                                               {"garbage", "18446744073709551615", "token_copy"}}) {
    Cmd({"FLUSHALL"});
    Register("h1", 1);
    Cmd({"SET", keys_.token(), token});
    if (!copy.empty()) Cmd({"SET", keys_.token_copy(), copy});
    const std::string version = Version();
    EXPECT_EQ(Take("lease-x", {U(0)}),
              (std::vector<std::string>{"exhausted", "18446744073709551615", holder}))
        << token << " " << copy;
    EXPECT_FALSE(Exists(keys_.lock(U(0))));
    EXPECT_FALSE(Exists(keys_.lease("lease-x")));
    EXPECT_EQ(Version(), version);
    EXPECT_EQ(Get(keys_.token()), token);
  }
}

// Garbage in the `token` key is ignored, never trusted: the copy keeps counting, so a token
// above the server's time (which the garbage would have made the floor) is not given again.
TEST_F(RedisScriptsTest, AGarbageTokenKeyNeverMakesATokenComeAgain) {
  Register("h1", 1);
  Cmd({"SET", keys_.token(), std::to_string(std::uint64_t{1} << 60)});
  std::uint64_t last = std::uint64_t{1} << 60;
  int n = 0;
  const auto take = [&](const std::string& what) {
    const std::string id = "lease-" + std::to_string(n++);
    const auto ok = Take(id, {U(0)});
    ASSERT_EQ(ok.at(0), "ok") << what;
    EXPECT_EQ(ok[1], std::to_string(last + 1)) << what;
    last = std::stoull(ok[1]);
    Release(id, {});
  };
  take("a valid counter");
  for (const std::string garbage : {"not-a-number", "99999999999999999999", "18446744073709551616",
                                    "-5", "0012", "1e30", "", " 42"}) {
    Cmd({"SET", keys_.token(), garbage});
    take("token = '" + garbage + "'");
  }
  for (const std::string kind : {"list", "hash"}) {
    Cmd({"DEL", keys_.token()});
    if (kind == "list")
      Cmd({"RPUSH", keys_.token(), "a"});
    else
      Cmd({"HSET", keys_.token(), "a", "b"});
    take("token of type " + kind);
  }
  // The copy damaged instead: the `token` key keeps counting.
  Cmd({"SET", keys_.token_copy(), "garbage"});
  take("garbage in the copy");
}

TEST_F(RedisScriptsTest, RenewRaisesTheTokenCounterExactly) {
  Register("h1", 1);
  const auto ok = Take("lease-k", {U(0)});
  ASSERT_EQ(ok.at(0), "ok");
  // 2^53 + 1 is no double: a Lua number would read it as 2^53, equal to the counter.
  Cmd({"SET", keys_.token(), "9007199254740992"});
  Cmd({"SET", keys_.token_copy(), "9007199254740992"});
  EXPECT_EQ(Renew("lease-k", 60000, "9007199254740993", {U(0)}).at(0), "ok");
  EXPECT_EQ(Get(keys_.token()), "9007199254740993");
  EXPECT_EQ(Get(keys_.token_copy()), "9007199254740993");
  // A token that is no count (a damaged record) raises nothing.
  EXPECT_EQ(Renew("lease-k", 60000, "99999999999999999999", {U(0)}).at(0), "ok");
  EXPECT_EQ(Get(keys_.token()), "9007199254740993");
}

TEST_F(RedisScriptsTest, ALockKeyHoldingAHashIsGarbageAndNeverFree) {
  Register("h1", 2);
  Cmd({"HSET", keys_.lock(U(0)), "not", "a lease"});
  EXPECT_EQ(SnapshotLock(U(0)), "!garbage");
  EXPECT_EQ(SnapshotLock(U(1)), "");
  AcquireArgs a;
  a.lease_id = "lease-g";
  a.expected_version = Version();
  a.candidates = {U(0)};
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"busy"});
  a.mode = "any";
  a.candidates = {U(0), U(1)};
  const auto ok = Texts(Acquire(a));
  ASSERT_EQ(ok.size(), 3u);
  EXPECT_EQ(ok[2], U(1));
  EXPECT_EQ(Cmd({"TYPE", keys_.lock(U(0))}).text, "hash");
  // Release and renew of a lease naming it leave it alone, and renew calls the lease lost.
  EXPECT_EQ(Release("lease-g", {U(0), U(1)}).integer, 1);
  EXPECT_EQ(Cmd({"TYPE", keys_.lock(U(0))}).text, "hash");
  EXPECT_EQ(Renew("lease-h", 60000, "1", {U(0)}),
            (std::vector<std::string>{"lost", U(0), "!garbage"}));
  EXPECT_EQ(Cmd({"TYPE", keys_.lock(U(0))}).text, "hash");
}

TEST_F(RedisScriptsTest, ALockKeyHoldingANonLeaseStringIsNeverFree) {
  Register("h1", 2);
  Cmd({"SET", keys_.lock(U(0)), "hello world"});
  // The script reports the raw value; the client (RedisPool) treats it as garbage.
  EXPECT_EQ(SnapshotLock(U(0)), "hello world");
  AcquireArgs a;
  a.lease_id = "lease-s";
  a.expected_version = Version();
  a.candidates = {U(0)};
  EXPECT_EQ(Texts(Acquire(a)), std::vector<std::string>{"busy"});
  EXPECT_EQ(Get(keys_.lock(U(0))), "hello world");
  EXPECT_EQ(Release("lease-s", {U(0)}).integer, 0);
  EXPECT_EQ(Get(keys_.lock(U(0))), "hello world");
}

TEST_F(RedisScriptsTest, AGarbageQueueOrTicketDoesNotMakeScriptsFail) {
  Register("h1", 2);
  // The queue key is a string.
  Cmd({"SET", keys_.queue(), "junk"});
  EXPECT_NO_THROW(Snapshot());
  AcquireArgs a;
  a.lease_id = "lease-1";
  a.expected_version = "";
  a.candidates = {U(0)};
  std::vector<std::string> reply;
  EXPECT_NO_THROW(reply = Texts(Acquire(a)));
  EXPECT_EQ(reply.at(0), "ok");
  // Entering replaces the garbage with a queue.
  EXPECT_NO_THROW(Enter("tk"));
  EXPECT_EQ(Cmd({"TYPE", keys_.queue()}).text, "zset");
  conn_->run(redis_scripts::kLeave, {keys_.version()}, {"tk"});

  // A queue member whose ticket is a string, another whose ticket is a list.
  Cmd({"ZADD", keys_.queue(), "1", "bad-1", "2", "bad-2"});
  Cmd({"SET", keys_.ticket("bad-1"), "junk"});
  Cmd({"RPUSH", keys_.ticket("bad-2"), "junk"});
  RedisValue snap;
  EXPECT_NO_THROW(snap = Snapshot());
  const auto tickets = Texts(snap.elements.at(5));
  ASSERT_EQ(tickets.size(), 12u);
  EXPECT_EQ(tickets[2], "");  // no body: the client ignores the entry
  EXPECT_EQ(tickets[8], "");
  a.lease_id = "lease-2";
  a.expected_version = Version();
  a.candidates = {U(1)};
  EXPECT_NO_THROW(reply = Texts(Acquire(a)));
  EXPECT_EQ(reply.at(0), "ok");
  // A ticket key that is garbage is replaced by Enter.
  Cmd({"SET", keys_.ticket("bad-3"), "junk"});
  EXPECT_NO_THROW(Enter("bad-3"));
  EXPECT_EQ(Cmd({"TYPE", keys_.ticket("bad-3")}).text, "hash");
  // A garbage served mark, queue counter and version.
  Cmd({"HSET", keys_.prefix() + "served:waiter", "a", "b"});
  Cmd({"HSET", keys_.prefix() + "queue_seq", "a", "b"});
  EXPECT_NO_THROW(Snapshot());
  EXPECT_NO_THROW(Enter("next"));
  Cmd({"DEL", keys_.version()});
  Cmd({"RPUSH", keys_.version(), "junk"});
  EXPECT_NO_THROW(snap = Snapshot());
  EXPECT_EQ(snap.elements.at(0).text, "!garbage");
  Release("lease-1", {});
  EXPECT_EQ(Get(keys_.version()), "1");  // the bump replaced it
}

TEST_F(RedisScriptsTest, GarbageInHostAndGpuKeysDoesNotMakeScriptsFail) {
  Register("h1", 2);
  Cmd({"SET", keys_.prefix() + "host:h1", "junk"});
  Cmd({"SET", keys_.prefix() + "gpus:h1", "junk"});
  Cmd({"SET", keys_.gpu(U(0)), "junk"});
  RedisValue snap;
  EXPECT_NO_THROW(snap = Snapshot());
  EXPECT_NO_THROW(Register("h1", 2));
  EXPECT_EQ(Cmd({"TYPE", keys_.gpu(U(0))}).text, "hash");
  EXPECT_EQ(Cmd({"TYPE", keys_.prefix() + "gpus:h1"}).text, "set");
  EXPECT_NO_THROW(snap = Snapshot());
  EXPECT_EQ(snap.elements.at(3).elements.size(), 16u);
  // A lease hash that is garbage: the snapshot shows it empty.
  ASSERT_EQ(Take("lease-gl", {U(0)}).at(0), "ok");
  Cmd({"DEL", keys_.lease("lease-gl")});
  Cmd({"SET", keys_.lease("lease-gl"), "junk"});
  EXPECT_NO_THROW(snap = Snapshot());
  const auto leases = Texts(snap.elements.at(4));
  ASSERT_EQ(leases.size(), 5u);
  EXPECT_EQ(leases[1], "");
  EXPECT_EQ(leases[4], "");
  // Renew replaces it with a hash again.
  EXPECT_EQ(Renew("lease-gl", 60000, "1", {U(0)}).at(0), "restored");
  EXPECT_EQ(Cmd({"TYPE", keys_.lease("lease-gl")}).text, "hash");
}

// A `hosts` key holding garbage (as anyone with write access to the prefix can leave) must not
// make register fail, or every acquire and status of every host would: register rebuilds it,
// and replaces garbage in host:<H>, gpus:<H> and gpu:<UUID>.
TEST_F(RedisScriptsTest, AGarbageHostsKeyDoesNotMakeRegisterFail) {
  Cmd({"SET", keys_.hosts(), "junk"});
  EXPECT_NO_THROW(Register("h1", 1));
  EXPECT_EQ(Cmd({"TYPE", keys_.hosts()}).text, "zset");
}

// --- shared leases: reservations per GPU (kAcquireShared, kRenewShared, kRelease) ------------

TEST_F(RedisScriptsTest, SharedReservationsCoexistUpToTheRoomAndExcludeExclusiveLocks) {
  ASSERT_EQ(Register("h1", 2).integer, 1);
  const auto a = TakeShared("lease-sa", {U(0)}, 160);
  const auto b = TakeShared("lease-sb", {U(0)}, 160);
  ASSERT_EQ(a, (std::vector<std::string>{"ok", a.at(1), U(0), "160"}));
  ASSERT_EQ(b, (std::vector<std::string>{"ok", b.at(1), U(0), "160"}));
  EXPECT_NE(a.at(1), b.at(1));  // a fencing token each
  EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 1), (std::vector<std::string>{"busy"}));
  // Independent reads: the mark, the reservations and their units.
  EXPECT_EQ(Get(keys_.lock(U(0))), redis_scripts::kSharedMark);
  EXPECT_GT(Pttl(keys_.lock(U(0))), 0);
  const auto shares = Shares(U(0));
  EXPECT_EQ(shares.size(), 2u);
  EXPECT_TRUE(shares.contains("lease-sa") && shares.contains("lease-sb"));
  EXPECT_EQ(Hash(keys_.prefix() + "share_units:" + U(0)),
            (std::map<std::string, std::string>{{"lease-sa", "160"}, {"lease-sb", "160"}}));
  EXPECT_EQ(Hash(keys_.lease("lease-sa")).at("units"), "160");
  // The reservations' keys expire with the mark: nothing stays once nobody renews.
  EXPECT_GT(Pttl(keys_.prefix() + "shares:" + U(0)), 0);
  EXPECT_LE(Pttl(keys_.prefix() + "shares:" + U(0)), Pttl(keys_.lock(U(0))) + 1000);
  EXPECT_GT(Pttl(keys_.prefix() + "share_units:" + U(0)), 0);
  // An exclusive acquire is refused on the shared GPU, and a shared one on an exclusive GPU.
  EXPECT_EQ(Take("lease-x", {U(0)}), (std::vector<std::string>{"busy"}));
  ASSERT_EQ(Take("lease-y", {U(1)}).at(0), "ok");
  EXPECT_EQ(TakeShared("lease-sd", {U(1)}, 1), (std::vector<std::string>{"busy"}));
  // The snapshot lists each live reservation: "ID UNITS PTTL".
  const RedisValue snap = Snapshot();
  const auto& gpus = snap.elements.at(3).elements;
  std::string lines;
  for (std::size_t i = 0; i + 7 < gpus.size(); i += 8)
    if (gpus[i].text == U(0)) lines = gpus[i + 7].text;
  EXPECT_NE(lines.find("lease-sa 160 "), std::string::npos) << lines;
  EXPECT_NE(lines.find("lease-sb 160 "), std::string::npos) << lines;
}

// What a user holds outside a snapshot's scope weighs as it does inside: a whole GPU as one, a
// shared lease as its units on each GPU with that GPU's memory (the client turns them into its
// part of the GPU). And the asking user's last service comes with any snapshot, as queued
// users' come with their tickets, so that every waiter's plan orders the queue alike.
TEST_F(RedisScriptsTest, ASnapshotWeighsSharedLeasesOutsideItsScopeByTheirUnits) {
  ASSERT_EQ(Register("h1", 2).integer, 1);
  ASSERT_EQ(Register("h2", 1).integer, 1);
  ASSERT_EQ(TakeShared("lease-sa", {U(0)}, 160).at(0), "ok");
  ASSERT_EQ(TakeShared("lease-sb", {U(0)}, 40).at(0), "ok");
  ASSERT_EQ(Take("lease-x", {U(1)}).at(0), "ok");
  const std::string memory = std::to_string(80ULL << 30);
  const RedisValue from_h2 =
      conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "tester"});
  ASSERT_EQ(from_h2.elements.size(), 11u);
  const auto elsewhere = Texts(from_h2.elements[6]);
  ASSERT_EQ(elsewhere.size(), 3u);
  EXPECT_EQ(elsewhere[0], "tester");
  EXPECT_EQ(elsewhere[1], "1");  // lease-x's GPU, whole
  const auto lines = split(elsewhere[2], '\n');
  EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()),
            (std::set<std::string>{"160 " + memory, "40 " + memory}));
  // The asking user's last service: the server's clock (ms) of its last acquire.
  const std::string served = from_h2.elements[10].text;
  EXPECT_EQ(served, Get(keys_.prefix() + "served:tester"));
  EXPECT_GT(std::stoll(served), 0);
  // A user who was never served, and a snapshot for nobody in particular, carry none.
  EXPECT_EQ(conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "newcomer"})
                .elements.at(10)
                .text,
            "");
  EXPECT_EQ(Snapshot("h2\n").elements.at(10).text, "");
  // A scope that holds h1 sees the leases there instead, and lists nothing elsewhere.
  const RedisValue from_h1 =
      conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h1\n", "tester"});
  EXPECT_EQ(from_h1.elements[6].elements.size(), 0u);
  EXPECT_EQ(from_h1.elements[4].elements.size(), 15u);  // the three leases
  // A GPU counts elsewhere only as a snapshot of its host would count it: one that h1 no longer
  // registers counts nowhere, nor does one whose lock another lease holds.
  ASSERT_EQ(Register("h1", 1).integer, 1);  // U(1), lease-x's, is gone from h1's list
  EXPECT_EQ(
      Texts(conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "tester"}).elements[6])
          .at(1),
      "0");
  ASSERT_EQ(Register("h1", 2).integer, 1);
  Cmd({"SET", keys_.lock(U(1)), "someone-else", "PX", "60000"});
  EXPECT_EQ(
      Texts(conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "tester"}).elements[6])
          .at(1),
      "0");
  Cmd({"SET", keys_.lock(U(1)), "lease-x", "PX", "60000"});
  EXPECT_EQ(
      Texts(conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "tester"}).elements[6])
          .at(1),
      "1");
  // A GPU listed twice by a damaged lease hash counts once.
  Cmd({"HSET", keys_.lease("lease-x"), "gpus", U(1) + "," + U(1)});
  EXPECT_EQ(
      Texts(conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "tester"}).elements[6])
          .at(1),
      "1");
  // A reservation that ended counts no more, though its lease still lists the GPU.
  Cmd({"ZADD", keys_.prefix() + "shares:" + U(0), "1", "lease-sb"});
  EXPECT_EQ(
      Texts(conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"h2\n", "tester"}).elements[6])
          .at(2),
      "160 " + memory);
}

TEST_F(RedisScriptsTest, ReleaseOfASharedLeaseRemovesOnlyItsReservation) {
  ASSERT_EQ(Register("h1", 1).integer, 1);
  ASSERT_EQ(TakeShared("lease-sa", {U(0)}, 200, 1, 60000).at(0), "ok");
  ASSERT_EQ(TakeShared("lease-sb", {U(0)}, 100, 1, 5000).at(0), "ok");
  EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 21), (std::vector<std::string>{"busy"}));
  EXPECT_EQ(Release("lease-sa", {U(0)}).integer, 1);
  EXPECT_EQ(Shares(U(0)).size(), 1u);
  EXPECT_TRUE(Shares(U(0)).contains("lease-sb"));
  // The mark lasts as long as the reservation left (5 s), no longer.
  EXPECT_LE(Pttl(keys_.lock(U(0))), 5000);
  EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 221), (std::vector<std::string>{"busy"}));
  EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 220).at(0), "ok");
  EXPECT_EQ(Release("lease-sb", {}).integer, 1);  // by the lease's record
  EXPECT_EQ(Release("lease-sc", {U(0)}).integer, 1);
  EXPECT_FALSE(Exists(keys_.lock(U(0))));
  EXPECT_FALSE(Exists(keys_.prefix() + "shares:" + U(0)));
  EXPECT_EQ(Take("lease-x", {U(0)}).at(0), "ok");
}

TEST_F(RedisScriptsTest, AnExpiredReservationFreesItsMemoryAndItsRenewalIsLost) {
  ASSERT_EQ(Register("h1", 1).integer, 1);
  const auto a = TakeShared("lease-sa", {U(0)}, 300, 1, 100);
  ASSERT_EQ(a.at(0), "ok");
  ASSERT_EQ(TakeShared("lease-sb", {U(0)}, 20, 1, 60000).at(0), "ok");
  // Wait (by the server's clock) until A's reservation has expired; B's keeps the mark.
  const long long expiry = Shares(U(0)).at("lease-sa");
  while (ServerMs() <= expiry) {
  }
  EXPECT_EQ(Get(keys_.lock(U(0))), redis_scripts::kSharedMark);
  EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 300).at(0), "ok");
  EXPECT_FALSE(Shares(U(0)).contains("lease-sa"));
  EXPECT_EQ(RenewShared("lease-sa", 60000, a.at(1), {{U(0), 300}}),
            (std::vector<std::string>{"lost", U(0), "expired"}));
  EXPECT_EQ(RenewShared("lease-sb", 60000, "1", {{U(0), 20}}), (std::vector<std::string>{"ok"}));
}

TEST_F(RedisScriptsTest, RenewSharedRestoresAfterTheServerLostItsKeysAndStealsNothing) {
  ASSERT_EQ(Register("h1", 2).integer, 1);
  const auto a = TakeShared("lease-sa", {U(0), U(1)}, 10, 2);
  ASSERT_EQ(a.at(0), "ok");
  Cmd({"DEL", keys_.lock(U(0)), keys_.prefix() + "shares:" + U(0), keys_.lease("lease-sa")});
  EXPECT_EQ(RenewShared("lease-sa", 60000, a.at(1), {{U(0), 10}, {U(1), 10}}),
            (std::vector<std::string>{"restored"}));
  EXPECT_EQ(Get(keys_.lock(U(0))), redis_scripts::kSharedMark);
  EXPECT_TRUE(Shares(U(0)).contains("lease-sa"));
  // A GPU held exclusively meanwhile makes the lease lost; nothing is taken from its holder.
  Cmd({"DEL", keys_.lock(U(1)), keys_.prefix() + "shares:" + U(1)});
  ASSERT_EQ(Take("lease-x", {U(1)}).at(0), "ok");
  EXPECT_EQ(RenewShared("lease-sa", 60000, a.at(1), {{U(0), 10}, {U(1), 10}}),
            (std::vector<std::string>{"lost", U(1), "lease-x"}));
  EXPECT_EQ(Get(keys_.lock(U(1))), "lease-x");
}

// Issue 42, defect 1: reservation keys of the wrong type, with units that are no count, or
// that disagree (a member of one missing from the other) must never free a GPU that shared
// leases hold. A release then removes nothing, the mark stays, no lease of either kind is given
// the GPU, the snapshot reports it unusable, and the holders keep it: their renewals say
// "damaged" and extend the mark. Once the mark ends (its holders gone), the GPU is whole again.
TEST_F(RedisScriptsTest, DamagedReservationKeysNeverFreeASharedGpu) {
  const std::string S = keys_.prefix() + "shares:" + U(0);
  const std::string Units = keys_.prefix() + "share_units:" + U(0);
  const std::vector<std::vector<std::vector<std::string>>> damages{
      {{"DEL", S}, {"SET", S, "junk"}},
      {{"DEL", Units}, {"RPUSH", Units, "junk"}},
      {{"HSET", Units, "lease-sa", "lots"}},
      {{"HDEL", Units, "lease-sb"}},
      {{"ZREM", S, "lease-sb"}},
      {{"DEL", S}},
      {{"DEL", Units}},
  };
  for (const auto& damage : damages) {
    const std::string what = fmt::format("{}", fmt::join(damage.front(), " "));
    Cmd({"FLUSHALL"});
    ASSERT_EQ(Register("h1", 1).integer, 1);
    const auto a = TakeShared("lease-sa", {U(0)}, 100);
    ASSERT_EQ(a.at(0), "ok");
    ASSERT_EQ(TakeShared("lease-sb", {U(0)}, 100).at(0), "ok");
    for (const auto& command : damage) Cmd(command);
    EXPECT_EQ(SnapshotLock(U(0)), redis_scripts::kDamagedShares) << what;
    EXPECT_EQ(Take("lease-x", {U(0)}), (std::vector<std::string>{"busy"})) << what;
    EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 1), (std::vector<std::string>{"busy"})) << what;
    EXPECT_EQ(Release("lease-sb", {U(0)}).integer, 0) << what;
    EXPECT_EQ(Get(keys_.lock(U(0))), redis_scripts::kSharedMark) << what;
    EXPECT_GT(Pttl(keys_.lock(U(0))), 0) << what;
    EXPECT_EQ(Take("lease-x", {U(0)}), (std::vector<std::string>{"busy"})) << what;
    EXPECT_EQ(RenewShared("lease-sa", 90000, a.at(1), {{U(0), 100}}),
              (std::vector<std::string>{"damaged", U(0)}))
        << what;
    EXPECT_GT(Pttl(keys_.lock(U(0))), 60000) << what;  // the holder keeps the mark
    // The mark ends (its holders are gone): the GPU is whole again, the keys rewritten.
    Cmd({"DEL", keys_.lock(U(0))});
    ASSERT_EQ(TakeShared("lease-sc", {U(0)}, 300).at(0), "ok") << what;
    EXPECT_EQ(Cmd({"TYPE", S}).text, "zset") << what;
    EXPECT_EQ(Hash(Units), (std::map<std::string, std::string>{{"lease-sc", "300"}})) << what;
    EXPECT_EQ(SnapshotLock(U(0)), redis_scripts::kSharedMark) << what;
  }
}

// Issue 42, defect 2: a lock key without an expiry (no script writes one) blocked its GPU
// forever when nothing held it. A snapshot that is given the caller's lease TTL gives it the
// expiry of what holds it (the lease, the last reservation) or, when nothing does, that TTL; a
// lock key that holds garbage stays as it is (never free), and without the TTL nothing changes.
TEST_F(RedisScriptsTest, ALockKeyWithoutAnExpiryGetsOne) {
  ASSERT_EQ(Register("h1", 5).integer, 1);
  const std::string orphan = "0123456789abcdef";
  Cmd({"SET", keys_.lock(U(0)), orphan});                      // names no lease
  Cmd({"SET", keys_.lock(U(1)), redis_scripts::kSharedMark});  // no reservation
  ASSERT_EQ(Take("00000000000000aa", {U(2)}, 90000).at(0), "ok");
  Cmd({"PERSIST", keys_.lock(U(2))});
  ASSERT_EQ(TakeShared("00000000000000bb", {U(3)}, 10, 1, 90000).at(0), "ok");
  Cmd({"PERSIST", keys_.lock(U(3))});
  Cmd({"SET", keys_.lock(U(4)), "junk"});
  Snapshot();  // an older client's: no TTL given, nothing changes
  for (unsigned i = 0; i < 5; ++i) EXPECT_EQ(Pttl(keys_.lock(U(i))), -1) << i;
  conn_->run(redis_scripts::kSnapshot, {keys_.version()}, {"", "", "5000"});
  EXPECT_GT(Pttl(keys_.lock(U(0))), 0);
  EXPECT_LE(Pttl(keys_.lock(U(0))), 5000);
  EXPECT_GT(Pttl(keys_.lock(U(1))), 0);
  EXPECT_LE(Pttl(keys_.lock(U(1))), 5000);
  EXPECT_GT(Pttl(keys_.lock(U(2))), 60000);  // its lease's
  EXPECT_GT(Pttl(keys_.lock(U(3))), 60000);  // its reservation's
  EXPECT_EQ(Pttl(keys_.lock(U(4))), -1);
  EXPECT_EQ(Get(keys_.lock(U(0))), orphan);  // blocked until then, never freed at once
}

// Issue 42, defect 3: a `hosts` key of the wrong type is rebuilt from the hosts' own keys, so
// that the other hosts stay in the pool, and the reply says what it held.
TEST_F(RedisScriptsTest, AGarbageHostsKeyIsRebuiltFromTheHostsKeys) {
  ASSERT_EQ(Register("h1", 1).integer, 1);
  ASSERT_EQ(Register("h2", 1).integer, 1);
  Cmd({"DEL", keys_.hosts()});
  Cmd({"SET", keys_.hosts(), "junk"});
  const RedisValue reply = Register("h3", 1);
  ASSERT_EQ(reply.elements.size(), 2u);
  EXPECT_EQ(reply.elements[1].text, "string");
  EXPECT_EQ(Texts(Cmd({"ZRANGE", keys_.hosts(), "0", "-1"})),
            (std::vector<std::string>{"h1", "h2", "h3"}));
  EXPECT_EQ(Register("h3", 1).integer, 0);  // whole again
}

TEST_F(RedisScriptsTest, NoSharedLeaseStartsWhileATicketWaitsAndTheCapCounts) {
  ASSERT_EQ(Register("h1", 1).integer, 1);
  ASSERT_EQ(Enter("ticket-1").integer, 1);
  EXPECT_EQ(TakeShared("lease-sa", {U(0)}, 1), (std::vector<std::string>{"queue"}));
  Cmd({"DEL", keys_.ticket("ticket-1")});  // its waiter died: the ticket expired
  ASSERT_EQ(TakeShared("lease-sa", {U(0)}, 1, 1, 60000, "2").at(0), "ok");
  ASSERT_EQ(TakeShared("lease-sb", {U(0)}, 1, 1, 60000, "2").at(0), "ok");
  EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 1, 1, 60000, "2"), (std::vector<std::string>{"busy"}));
  EXPECT_EQ(TakeShared("lease-sc", {U(0)}, 1, 1, 60000, "3").at(0), "ok");
}

TEST_F(RedisScriptsTest, TheSnapshotReadsEachLockOfAHostAsItsValueOrGarbage) {
  // One host's locks are read together (MGET, and EXISTS to find keys of another type): each
  // GPU still gets its own value, whatever its neighbours hold.
  Register("h1", 5);
  AcquireArgs a;
  a.lease_id = "lease-m";
  a.expected_version = Version();
  a.candidates = {U(0)};
  ASSERT_EQ(Texts(Acquire(a)).at(0), "ok");
  Cmd({"SET", keys_.lock(U(1)), "hello world"});
  Cmd({"HSET", keys_.lock(U(2)), "not", "a lease"});
  Cmd({"RPUSH", keys_.lock(U(4)), "a list"});
  EXPECT_EQ(SnapshotLock(U(0)), "lease-m");
  EXPECT_EQ(SnapshotLock(U(1)), "hello world");
  EXPECT_EQ(SnapshotLock(U(2)), "!garbage");
  EXPECT_EQ(SnapshotLock(U(3)), "");
  EXPECT_EQ(SnapshotLock(U(4)), "!garbage");
  // Without keys of another type, free GPUs read as free.
  Cmd({"DEL", keys_.lock(U(2)), keys_.lock(U(4))});
  EXPECT_EQ(SnapshotLock(U(2)), "");
  EXPECT_EQ(SnapshotLock(U(4)), "");
  EXPECT_EQ(SnapshotLock(U(0)), "lease-m");
}

TEST_F(RedisScriptsTest, EnterSaysWhetherThePoolWasStillTheCallersSnapshot) {
  Register("h1", 1);
  const std::string before = Version();
  const long long start_ms = ServerMs();
  RedisValue r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                            {"ticket-a", "60000", "{\"body\":1}", "waiter", "", before});
  ASSERT_EQ(r.elements.size(), 5u);
  EXPECT_EQ(r.elements[0].integer, 1);
  EXPECT_EQ(r.elements[1].integer, 1);
  // The version after the entry, the server's clock (microseconds) when it was made, and the
  // queue's length.
  EXPECT_EQ(r.elements[2].text, Version());
  EXPECT_NE(r.elements[2].text, before);
  EXPECT_GE(static_cast<long long>(parse_server_us(r.elements[3].text) / 1000), start_ms);
  EXPECT_LE(static_cast<long long>(parse_server_us(r.elements[3].text) / 1000), ServerMs());
  EXPECT_EQ(r.elements[4].integer, 1);
  // The entry moved the version: a second entry made from the same snapshot is told.
  r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                 {"ticket-b", "60000", "{\"body\":1}", "waiter", "", before});
  ASSERT_EQ(r.elements.size(), 5u);
  EXPECT_EQ(r.elements[0].integer, 2);
  EXPECT_EQ(r.elements[1].integer, 0);
  EXPECT_EQ(r.elements[4].integer, 2);
  // Without a version, nothing is claimed.
  r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                 {"ticket-c", "60000", "{\"body\":1}", "waiter", ""});
  ASSERT_EQ(r.elements.size(), 5u);
  EXPECT_EQ(r.elements[1].integer, 0);
}

// A release while nobody waits leaves the version as it is, but moves `frees`: a newcomer that
// planned while the GPU was held, and enters just after the release, is told that its plan is
// stale (it would otherwise sleep on the lock's TTL with the GPU free).
TEST_F(RedisScriptsTest, AReleaseWhileNobodyWaitsMakesAnEntryPlannedBeforeItPlanAgain) {
  Register("h1", 1);
  ASSERT_EQ(Take("lease-h", {U(0)}).at(0), "ok");
  RedisValue snap = Snapshot();
  ASSERT_EQ(snap.elements.size(), 11u);
  const std::string version = snap.elements[0].text;
  const std::string frees = snap.elements[9].text;
  EXPECT_EQ(Release("lease-h", {U(0)}).integer, 1);
  EXPECT_EQ(Version(), version);  // nobody waited
  EXPECT_NE(Get(keys_.prefix() + "frees"), frees);
  RedisValue r =
      conn_->run(redis_scripts::kEnter, {keys_.version()},
                 {"ticket-n", "60000", "{\"body\":1}", "waiter", "", version, "1", frees});
  ASSERT_EQ(r.elements.size(), 5u);
  EXPECT_EQ(r.elements[1].integer, 0);
  EXPECT_NE(Version(), version);  // and, not believed to be behind everyone, it bumps
  // From a snapshot taken after the release, the same entry stands.
  snap = Snapshot();
  r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                 {"ticket-m", "60000", "{\"body\":1}", "waiter", "", snap.elements[0].text, "1",
                  snap.elements[9].text});
  EXPECT_EQ(r.elements[1].integer, 1);
  // Garbage in `frees` is replaced at the next release, never a script error.
  Cmd({"DEL", keys_.prefix() + "frees"});
  Cmd({"RPUSH", keys_.prefix() + "frees", "junk"});
  ASSERT_EQ(Take("lease-g", {U(0)}).at(0), "ok");
  EXPECT_NO_THROW(snap = Snapshot());
  EXPECT_EQ(snap.elements[9].text, "!garbage");
  EXPECT_EQ(Release("lease-g", {U(0)}).integer, 1);
  EXPECT_EQ(Get(keys_.prefix() + "frees"), "1");
}

// An entry whose caller's plan put it last, served and reserving nothing, leaves the version as
// it is while that is still the caller's snapshot's: an acquire planned at that version (the
// waiter a release woke) is not refused as stale. Others, and any entry made from an older
// snapshot, move it.
TEST_F(RedisScriptsTest, AnEntryBehindEveryoneLeavesTheVersionAndTheAcquiresPlannedAtIt) {
  Register("h1", 1);
  Enter("ticket-w");
  const std::string planned = Version();
  RedisValue r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                            {"ticket-n", "60000", "{\"body\":1}", "waiter", "", planned, "1"});
  ASSERT_EQ(r.elements.size(), 5u);
  EXPECT_EQ(r.elements[1].integer, 1);
  EXPECT_EQ(r.elements[2].text, planned);
  EXPECT_EQ(Version(), planned);
  EXPECT_EQ(r.elements[4].integer, 2);  // the 1 ticket it planned with, and itself
  // The woken waiter's acquire, planned at that version, is taken.
  AcquireArgs a;
  a.lease_id = "lease-w";
  a.expected_version = planned;
  a.needed = 1;
  a.candidates = {U(0)};
  a.ticket = "ticket-w";
  EXPECT_EQ(Texts(Acquire(a)).at(0), "ok");
  EXPECT_NE(Version(), planned);  // served while someone waits: the version moves
  // From a snapshot that is no longer the pool's, "behind everyone" is not believed.
  r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                 {"ticket-m", "60000", "{\"body\":1}", "waiter", "", planned, "1"});
  EXPECT_EQ(r.elements[1].integer, 0);
  EXPECT_EQ(r.elements[2].text, Version());
  const std::string after = Version();
  EXPECT_NE(after, planned);
  // Two callers from the same snapshot, both last in their own plans: the version stays, and the
  // second learns from the queue's length that someone it did not plan with entered.
  r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                 {"ticket-x", "60000", "{\"body\":1}", "waiter", "", after, "1"});
  ASSERT_EQ(r.elements.size(), 5u);
  EXPECT_EQ(r.elements[1].integer, 1);
  EXPECT_EQ(r.elements[2].text, after);
  const long long length_x = r.elements[4].integer;
  r = conn_->run(redis_scripts::kEnter, {keys_.version()},
                 {"ticket-y", "60000", "{\"body\":1}", "waiter", "", after, "1"});
  EXPECT_EQ(r.elements[1].integer, 1);
  EXPECT_EQ(Version(), after);
  EXPECT_EQ(r.elements[4].integer, length_x + 1);
}

TEST_F(RedisScriptsTest, AcquireWakesTheTicketsItIsGivenAfterItsOwnChange) {
  Register("h1", 2);
  Enter("ticket-a");
  Enter("ticket-b");
  const std::string wake_a = keys_.prefix() + "wake:ticket-a";
  const std::string wake_b = keys_.prefix() + "wake:ticket-b";
  AcquireArgs a;
  a.lease_id = "lease-1";
  a.candidates = {U(0)};
  a.to_wake = {"ticket-a", "ticket-b", "ticket-gone"};
  // Refused (the version moved): they are woken all the same (the caller plans again, and they
  // need not wait for it), at the version that made the caller's plan stale.
  a.expected_version = "not-the-version";
  EXPECT_EQ(Texts(Acquire(a)).at(0), "stale");
  for (const std::string& key : {wake_a, wake_b}) {
    const std::optional<PoolMoment> pushed = parse_wake_message(Cmd({"LPOP", key}).text);
    ASSERT_TRUE(pushed.has_value()) << key;
    EXPECT_EQ(pushed->version, Version()) << key;
  }
  // Served: both live tickets are woken, with the version after the acquire's own bump, so a
  // plan they make from then on sees this lease.
  const std::string before = Version();
  a.expected_version = before;
  EXPECT_EQ(Texts(Acquire(a)).at(0), "ok");
  const std::string after = Version();
  EXPECT_NE(after, before);
  for (const std::string& key : {wake_a, wake_b}) {
    const std::optional<PoolMoment> pushed = parse_wake_message(Cmd({"LPOP", key}).text);
    ASSERT_TRUE(pushed.has_value()) << key;
    EXPECT_EQ(pushed->version, after) << key;
  }
  EXPECT_EQ(Cmd({"EXISTS", keys_.prefix() + "wake:ticket-gone"}).integer, 0);
}

TEST_F(RedisScriptsTest, AWakeCarriesTheVersionAfterItsScriptAndTheServersClock) {
  Register("h1", 1);
  Enter("ticket-a");
  const std::string wake_key = keys_.prefix() + "wake:ticket-a";
  // A planner's wake: the pool's version now, and a clock later than any snapshot before it.
  const RedisValue snap = Snapshot();
  ASSERT_EQ(conn_->run(redis_scripts::kWake, {keys_.version()}, {"ticket-a"}).integer, 1);
  std::optional<PoolMoment> pushed = parse_wake_message(Cmd({"LPOP", wake_key}).text);
  ASSERT_TRUE(pushed.has_value());
  EXPECT_EQ(pushed->version, Version());
  EXPECT_GT(pushed->server_us, parse_server_us(snap.elements[8].text));
  // So a waiter that planned from that snapshot must plan again; one that planned after the
  // wake, at the same version, need not.
  const PoolMoment planned_before{snap.elements[0].text, parse_server_us(snap.elements[8].text)};
  EXPECT_TRUE(
      wake_is_news(fmt::format("{} {}", pushed->version, pushed->server_us), planned_before));
  const RedisValue later = Snapshot();
  EXPECT_FALSE(
      wake_is_news(fmt::format("{} {}", pushed->version, pushed->server_us),
                   PoolMoment{later.elements[0].text, parse_server_us(later.elements[8].text)}));

  // A release wakes the queue's head after it bumped the version: the wake has the new one,
  // which no snapshot taken before the release had.
  const auto token = Take("lease-a", {U(0)});
  ASSERT_EQ(token.at(0), "ok");
  const RedisValue before_release = Snapshot();
  Cmd({"DEL", wake_key});
  Release("lease-a", {U(0)});
  pushed = parse_wake_message(Cmd({"LPOP", wake_key}).text);
  ASSERT_TRUE(pushed.has_value());
  EXPECT_EQ(pushed->version, Version());
  EXPECT_NE(pushed->version, before_release.elements[0].text);
  EXPECT_TRUE(wake_is_news(fmt::format("{} {}", pushed->version, pushed->server_us),
                           PoolMoment{before_release.elements[0].text,
                                      parse_server_us(before_release.elements[8].text)}));
}

}  // namespace
}  // namespace gpulock
