// RedisBackend: one pool of GPUs across hosts and containers, kept in a Redis server.
//
// Each process registers its host's GPUs, reads the pool in one script call (snapshot), plans
// the queue with the same planner as the local backend, and takes or releases GPUs with atomic
// scripts (redis_scripts.h). Leases expire unless their holder renews them
// (redis_lease_keeper.h). Waiters are tickets in Redis, renewed by heartbeats, each blocked on
// its own wake list (BLPOP), which a release and other waiters' plans push to.
// See docs/design-redis.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/acquire_loop.h"
#include "backend/holder_record.h"
#include "backend/lease_backend.h"
#include "backend/lock_state.h"
#include "backend/queue_snapshot.h"
#include "gpulock/gpu_pool.hpp"
#include "queue/ticket.h"
#include "redis/redis_connection_cache.h"
#include "redis/redis_scripts.h"
#include "redis/redis_settings.h"

namespace gpulock {

class RedisBackend final : public LeaseBackend {
 public:
  RedisBackend(std::unique_ptr<DeviceSource> source, Config config, const PoolOptions& options,
               RedisSettings settings);

  // An exclusive lease (redis_acquire.cc) or, for request.memory_bytes or request.slots, a
  // shared one: reservations of GPUs' memory (redis_acquire_shared.cc); both through
  // run_acquire_loop() (redis_round.cc).
  Lease acquire(const LeaseRequest& request, const WaitHooks& hooks) override;
  PoolStatus status() override { return status(/*whole_pool=*/false); }
  PoolStatus pool_status() override { return status(/*whole_pool=*/true); }
  QueueStatus queue() override;
  void release(const std::string& lease_id, bool also_run) override;
  std::vector<DoctorCheck> doctor() override;
  void prepare() override {}  // nothing on this machine to prepare

  std::string name() const override { return "redis"; }
  bool spans_hosts() const override { return true; }
  const Config& config() const override { return config_; }
  DeviceSource& device_source() override { return *source_; }
  const std::filesystem::path& lock_dir() const override;  // empty: there is none
  std::vector<std::string> warnings() const override { return {}; }
  std::shared_ptr<UsageJournal> journal() override { return journal_; }
  const RedisSettings& settings() const { return settings_; }

  // The pool as one snapshot script call read it.
  // A shared lease's reservation on a GPU.
  struct Share {
    std::string lease_id;
    std::uint64_t units = 0;  // of kSharedMemoryUnitBytes
    long long ttl_ms = 0;
  };
  struct Gpu {
    Device device;
    std::string host;
    bool local = false;  // a GPU of this host (its device data is live)
    // The lease id holding it, "" when free, redis_scripts::kSharedMark when shared leases hold
    // it (then `shares` says which), or, when it is unusable, kGarbageLock (its lock key holds
    // something else) or kDamagedShares (its shared leases' keys are damaged).
    std::string lock;
    long long lock_ttl_ms = -2;
    std::vector<Share> shares;
    bool shared() const { return lock == redis_scripts::kSharedMark; }
    // Why no lease may be given it whatever else the pool holds ("" when none), for messages.
    std::string unusable_reason() const;
  };
  struct LeaseEntry {
    std::optional<HolderRecord> record;  // unset when missing or malformed
    std::uint64_t token = 0;
    long long ttl_ms = -2;
    // Whose it is, as the acquire wrote it (not the record's, changed for display): the name
    // tickets and `held:` sets use, by which fair share counts it ("" when unknown).
    std::string user;
  };
  struct HostEntry {
    std::string name;
    long long registered_at_ms = 0;
  };
  struct Snapshot {
    std::string version;
    long long now_ms = 0;
    std::uint64_t server_us = 0;  // the server's clock, microseconds (0: an older script's reply)
    std::string frees;            // the count of releases (kSnapshot), "" before the first
    std::vector<HostEntry> hosts;
    std::vector<Gpu> gpus;
    // This host's GPUs as registered, by UUID, as other hosts read them (unreadable ones left
    // out); kept apart from `gpus`, which hold their live readings.
    std::map<std::string, Device> registered_here;
    std::map<std::string, LeaseEntry> leases;
    std::vector<Ticket> tickets;     // in arrival order; uid replaced by a per-user number
    std::vector<uid_t> ticket_uids;  // parallel: the uid the ticket's host gave
    // Parallel: the ms left before the ticket expires unless its waiter renews it (-1: none).
    std::vector<long long> ticket_ttl_ms;
    std::map<std::string, std::int64_t> user_last_served;
    // GPUs each user (of a ticket, or the one asking) holds on hosts outside the snapshot's
    // scope, whole and (in 1/kShareScale of a GPU) by shared leases; empty for a whole-pool
    // snapshot, which sees every lease.
    std::map<std::string, unsigned> held_elsewhere;
    std::map<std::string, std::uint64_t> shared_elsewhere;
    bool whole_pool = true;  // the scope widened to every host (or was asked for)
    std::vector<std::string> warnings;
  };

 private:
  // The rounds of an acquire (redis_round.h): nested, so that they reach the pool's parts.
  class Round;
  class ExclusiveRound;
  class SharedRound;
  std::unique_ptr<Round> exclusive_round(const LeaseRequest& request, const WaitHooks& hooks,
                                         const AcquireWait& wait, std::string user);
  std::unique_ptr<Round> shared_round(const LeaseRequest& request, const WaitHooks& hooks,
                                      const AcquireWait& wait, std::string user);
  // Throws kInvalidArgument for a shared request's memory or slots that make no sense.
  static void check_shared_request(const LeaseRequest& request);

  // This host's devices, registered in Redis when they changed or the registration is old.
  std::vector<Device> register_devices(RedisConnection& connection, bool force = false);
  // Registers `devices` as this host's (readings as read by the caller).
  void register_readings(RedisConnection& connection, const std::vector<Device>& devices,
                         bool force);
  // The pool as seen from `scope` (empty: every host): the scope's hosts and GPUs, widened to
  // the hosts any queued ticket may use, the whole queue, and for `user` and each queued user
  // how many GPUs they hold outside the scope. Its cost follows the scope and the queue, not
  // the pool.
  Snapshot snapshot(RedisConnection& connection, const std::vector<std::string>& scope,
                    const std::string& user, const std::vector<Device>& local_devices);
  // The snapshot reply's hosts and GPUs (this host's with their live readings), and its queue.
  void read_snapshot_gpus(const RedisValue& hosts, const RedisValue& gpus,
                          const std::vector<Device>& local_devices, Snapshot& out);
  void read_snapshot_tickets(const RedisValue& tickets, Snapshot& out);
  // A snapshot in which this host is registered: registers it again first if the server lost
  // it (a restart), updating `local_devices`. This host is always in its scope.
  Snapshot registered_snapshot(RedisConnection& connection, std::vector<std::string> scope,
                               const std::string& user, std::vector<Device>& local_devices);
  // Every registered host's name (for messages; a snapshot lists only its scope's hosts).
  std::vector<std::string> host_names(RedisConnection& connection);
  // The queue planned from a snapshot (the same planner and explanations as the local queue).
  QueueSnapshot plan(const Snapshot& snapshot, const Ticket* newcomer);
  // Whether this host's registered readings would give some ticket of `planned` a different
  // health verdict on one of this host's GPUs than its live readings give: waiters of other
  // hosts, which plan with the registered readings, would then disagree with this host's.
  static bool registration_misleads(const Snapshot& snapshot, const QueueSnapshot& planned);
  // The queue as people see it, planned from a snapshot.
  QueueStatus queue_of(const Snapshot& snapshot);
  // A registered device from its JSON, parsed once per distinct registration.
  std::optional<Device> registered_device(std::string_view static_json,
                                          std::string_view readings_json);
  // A queued ticket from its JSON body, parsed once per distinct body.
  std::optional<Ticket> queued_ticket(const std::string& body);
  // The number standing for a user in plans (users are the same person on every host by name).
  uid_t plan_uid(const std::string& user);
  // Who holds a GPU, as plans and status read it.
  LockState lock_state_of(const Gpu& gpu, const Snapshot& snapshot) const;
  GpuStatus describe(const Gpu& gpu, const Snapshot& snapshot) const;
  PoolStatus status(bool whole_pool);

  std::unique_ptr<DeviceSource> source_;
  Config config_;
  PoolOptions options_;
  RedisSettings settings_;
  std::shared_ptr<RedisConnectionCache> connections_;
  std::shared_ptr<UsageJournal> journal_;  // the pool's stream

  std::mutex mutex_;
  std::string registered_signature_;
  std::chrono::steady_clock::time_point registered_at_;
  std::map<std::string, uid_t> plan_uids_;
  std::unordered_map<std::string, std::optional<Device>> parsed_devices_;
  std::unordered_set<std::size_t> devices_seen_once_;  // hashes of registrations seen
  std::unordered_map<std::string, std::optional<Ticket>> parsed_tickets_;
  std::size_t parsed_devices_wanted_ = 0;  // the most GPUs a snapshot has listed
};

}  // namespace gpulock
