// RedisBackend: registration of this host's GPUs, reading the pool (snapshot) and planning it.
#include "redis/redis_backend.h"
#include "redis/redis_journal.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/health_agreement.h"
#include "backend/queue_request.h"
#include "backend/shared_memory_units.h"
#include "gpulock/error.hpp"
#include "gpulock/version.hpp"
#include "redis/device_record.h"
#include "redis/packed_registrations.h"
#include "redis/redis_scripts.h"
#include "redis/script_calls.h"
#include "redis/wake_message.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;

// Registration refreshes the readings other hosts' health filters use at least this often
// when this host leases or shows its status.
constexpr auto kRegistrationRefresh = std::chrono::seconds(30);

// Registrations parsed and kept (about 1 KiB each): at least this many, and at least twice the
// GPUs of the last snapshot, so that a large pool never empties the cache on every call.
constexpr std::size_t kMostParsedDevices = 2048;
// Queued tickets parsed and kept (a few hundred bytes each).
constexpr std::size_t kMostParsedTickets = 8192;

const RedisValue& element(const RedisValue& array, std::size_t i) {
  static const RedisValue nil;
  return array.type == RedisValue::Type::kArray && i < array.elements.size() ? array.elements[i]
                                                                             : nil;
}

long long integer_of(const RedisValue& value) {
  if (value.type == RedisValue::Type::kInteger) return value.integer;
  return whole_number<long long>(value.text).value_or(0);
}

// The part of a GPU of `total` bytes that a shared reservation of `units` holds, in
// 1/kShareScale of a GPU, as fair share weighs it (units are at most kSharedMemoryMostUnits + 1,
// so the product cannot overflow).
std::uint64_t shared_part(std::uint64_t units, std::uint64_t total) {
  units = std::min(units, kSharedMemoryMostUnits + 1);
  return total == 0 ? 0 : units * kSharedMemoryUnitBytes * kShareScale / total;
}

}  // namespace

RedisBackend::RedisBackend(std::unique_ptr<DeviceSource> source, Config config,
                           const PoolOptions& options, RedisSettings settings)
    : source_(std::move(source)),
      config_(std::move(config)),
      options_(options),
      settings_(std::move(settings)),
      connections_(std::make_shared<RedisConnectionCache>(settings_.endpoint,
                                                          std::chrono::milliseconds(5000))),
      journal_(std::make_shared<RedisJournal>(connections_, settings_.prefix() + "journal")) {}

std::optional<Device> RedisBackend::registered_device(std::string_view static_json,
                                                      std::string_view readings_json) {
  // Parsing is most of a large snapshot's cost, and a registration changes at most every 30 s:
  // a waiter that plans on every event, or a process showing status repeatedly, parses each
  // registration once. A registration is kept from the second time it is seen: a one-shot
  // process (`gpulock status --pool`) sees each once, and copying 800 of them into the cache
  // cost it ~600 KB of fresh memory, a page fault per 4 KiB.
  const std::size_t hash =
      std::hash<std::string_view>{}(static_json)*31 + std::hash<std::string_view>{}(readings_json);
  std::string key;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (devices_seen_once_.insert(hash).second) {
      if (devices_seen_once_.size() > 4 * std::max(kMostParsedDevices, parsed_devices_wanted_))
        devices_seen_once_.clear();
    } else {
      key = static_json;
      key += '\n';  // never in the JSON we write (dump() without indent)
      key += readings_json;
      if (const auto it = parsed_devices_.find(key); it != parsed_devices_.end()) return it->second;
    }
  }
  std::optional<Device> device = parse_registered_device(static_json, readings_json);
  if (key.empty()) return device;  // seen for the first time
  std::lock_guard<std::mutex> lock(mutex_);
  if (parsed_devices_.size() >= std::max(kMostParsedDevices, 2 * parsed_devices_wanted_))
    parsed_devices_.clear();
  parsed_devices_.emplace(std::move(key), device);
  return device;
}

std::optional<Ticket> RedisBackend::queued_ticket(const std::string& body) {
  // A waiter plans on every wake with the same tickets: parse each body once. Bodies are
  // untrusted, and the cache is keyed by the whole body, so a changed one is parsed again.
  std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = parsed_tickets_.find(body); it != parsed_tickets_.end()) return it->second;
  std::optional<Ticket> ticket = parse_ticket(body);
  if (parsed_tickets_.size() >= kMostParsedTickets) parsed_tickets_.clear();
  parsed_tickets_.emplace(body, ticket);
  return ticket;
}

uid_t RedisBackend::plan_uid(const std::string& user) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto [it, added] = plan_uids_.emplace(user, static_cast<uid_t>(plan_uids_.size() + 1));
  return it->second;
}

std::vector<Device> RedisBackend::register_devices(RedisConnection& connection, bool force) {
  std::vector<Device> devices = source_->devices();
  register_readings(connection, devices, force);
  return devices;
}

void RedisBackend::register_readings(RedisConnection& connection,
                                     const std::vector<Device>& devices, bool force) {
  std::vector<std::string> args{
      settings_.host, nlohmann::json{{"gpulock", GPULOCK_VERSION_STRING},
                                     {"device_source", source_->description()},
                                     {"simulated", source_->simulated()}}
                          .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
  std::string signature;
  for (const auto& device : devices) {
    args.push_back(device.uuid);
    args.push_back(device_static_json(device));
    args.push_back(device_readings_json(device));
    signature += args[args.size() - 2];
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!force && signature == registered_signature_ &&
        Clock::now() - registered_at_ < kRegistrationRefresh)
      return;
  }
  const RedisValue reply =
      connection.run(redis_scripts::kRegister, {settings_.version_key()}, args);
  if (reply.type == RedisValue::Type::kArray && reply.elements.size() == 2)
    std::fprintf(stderr,
                 "gpulock: warning: pool '%s': its list of hosts (%shosts) held a %s, not a sorted "
                 "set; it was rebuilt from the hosts' own keys\n",
                 settings_.pool.c_str(), settings_.prefix().c_str(),
                 sanitize_for_display(reply.elements[1].text, 20).c_str());
  std::lock_guard<std::mutex> lock(mutex_);
  registered_signature_ = signature;
  registered_at_ = Clock::now();
}

std::string RedisBackend::Gpu::unusable_reason() const {
  if (lock == redis_scripts::kGarbageLock)
    return "its lock key in Redis holds something that is not a lease (see `gpulock doctor`)";
  if (lock == redis_scripts::kDamagedShares)
    return "its shared leases' keys in Redis are damaged, so nobody can tell what they hold; no "
           "lease is given it until they have ended (see `gpulock doctor`)";
  return "";
}

namespace {

// A shared GPU's live reservations, one line each: "LEASE_ID UNITS PTTL"; unreadable ones are
// skipped.
std::vector<RedisBackend::Share> read_shares(const std::string& text) {
  std::vector<RedisBackend::Share> shares;
  for (const std::string& line : split(text, '\n')) {
    const std::vector<std::string> fields = split(line, ' ');
    if (fields.size() != 3 || !is_lease_id(fields[0])) continue;
    const auto units = whole_number<std::uint64_t>(fields[1]);
    const auto ttl = whole_number<long long>(fields[2]);
    if (!units || !ttl) continue;
    shares.push_back(RedisBackend::Share{fields[0], *units, *ttl});
  }
  return shares;
}

// This host's GPUs first, each host's in index order. The order is sorted, not the GPUs (~400
// bytes each): each is then moved once, not at every step of a merge.
void sort_gpus(std::vector<RedisBackend::Gpu>& gpus) {
  using Gpu = RedisBackend::Gpu;
  const auto before = [](const Gpu& a, const Gpu& b) {
    if (a.local != b.local) return a.local;
    if (a.host != b.host) return a.host < b.host;
    if (a.device.index != b.device.index) return a.device.index < b.device.index;
    return a.device.mig_index.value_or(0) < b.device.mig_index.value_or(0);
  };
  if (std::is_sorted(gpus.begin(), gpus.end(), before)) return;
  std::vector<std::size_t> order(gpus.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return before(gpus[a], gpus[b]); });
  // In place, cycle by cycle: position k takes the GPU that was at order[k].
  std::vector<bool> placed(order.size(), false);
  for (std::size_t k = 0; k < order.size(); ++k) {
    if (placed[k] || order[k] == k) continue;
    Gpu first = std::move(gpus[k]);
    for (std::size_t to = k;;) {
      const std::size_t from = order[to];
      placed[to] = true;
      if (from == k) {
        gpus[to] = std::move(first);
        break;
      }
      gpus[to] = std::move(gpus[from]);
      to = from;
    }
  }
}

void read_leases(const RedisValue& leases, RedisBackend::Snapshot& out) {
  namespace lease = snapshot_reply::lease;
  for (std::size_t i = 0; i + lease::kWidth <= leases.elements.size(); i += lease::kWidth) {
    const RedisValue* l = &leases.elements[i];
    RedisBackend::LeaseEntry entry;
    const std::string& id = l[lease::kId].text;
    entry.record = parse_holder_record(l[lease::kRecord].text);
    if (entry.record && entry.record->lease_id != id) entry.record.reset();
    entry.token = whole_number<std::uint64_t>(l[lease::kToken].text).value_or(0);
    entry.ttl_ms = integer_of(l[lease::kTtlMs]);
    entry.user = l[lease::kUser].text;
    out.leases.emplace(id, std::move(entry));
  }
}

void read_held_elsewhere(const RedisValue& elsewhere, RedisBackend::Snapshot& out) {
  namespace other = snapshot_reply::elsewhere;
  for (std::size_t i = 0; i + other::kWidth <= elsewhere.elements.size(); i += other::kWidth) {
    const RedisValue* e = &elsewhere.elements[i];
    const std::string& name = e[other::kUser].text;
    if (const long long whole = integer_of(e[other::kWholeGpus]); whole > 0)
      out.held_elsewhere[name] = static_cast<unsigned>(std::min<long long>(whole, 1 << 20));
    for (const std::string& line : split(e[other::kShared].text, '\n')) {
      const std::vector<std::string> fields = split(line, ' ');
      if (fields.size() != 2) continue;
      const auto units = whole_number<std::uint64_t>(fields[0]);
      const auto total = whole_number<std::uint64_t>(fields[1]);
      if (units && total) out.shared_elsewhere[name] += shared_part(*units, *total);
    }
  }
}

}  // namespace

void RedisBackend::read_snapshot_gpus(const RedisValue& hosts, const RedisValue& gpus,
                                      const std::vector<Device>& local_devices, Snapshot& out) {
  // Hosts whose GPUs' registrations came packed (redis/packed_registrations.h); a package that
  // is unreadable makes each of its GPUs' registrations unreadable.
  std::unordered_map<std::string_view,
                     std::optional<std::unordered_map<std::string_view, PackedRegistration>>>
      packed_of;
  namespace host = snapshot_reply::host;
  for (std::size_t i = 0; i + host::kWidth <= hosts.elements.size(); i += host::kWidth) {
    const RedisValue* h = &hosts.elements[i];
    out.hosts.push_back(HostEntry{
        h[host::kName].text,
        static_cast<long long>(whole_number<double>(h[host::kRegisteredAtMs].text).value_or(0))});
    if (!h[host::kPacked].text.empty())
      packed_of.emplace(h[host::kName].text, unpack_registrations(h[host::kPacked].text));
  }

  namespace field = snapshot_reply::gpu;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    parsed_devices_wanted_ = std::max(parsed_devices_wanted_, gpus.elements.size() / field::kWidth);
  }
  out.gpus.reserve(gpus.elements.size() / field::kWidth);
  for (std::size_t i = 0; i + field::kWidth <= gpus.elements.size(); i += field::kWidth) {
    const RedisValue* g = &gpus.elements[i];
    Gpu gpu;
    const std::string& uuid = g[field::kUuid].text;
    gpu.host = g[field::kHost].text;
    gpu.lock = g[field::kLock].text;
    gpu.lock_ttl_ms = integer_of(g[field::kLockTtlMs]);
    if (!gpu.lock.empty() && gpu.lock != redis_scripts::kGarbageLock &&
        gpu.lock != redis_scripts::kDamagedShares && gpu.lock != redis_scripts::kSharedMark &&
        !is_lease_id(gpu.lock))
      gpu.lock = redis_scripts::kGarbageLock;
    if (gpu.shared()) gpu.shares = read_shares(g[field::kShares].text);
    std::string_view static_json = g[field::kInfo].text;
    std::string_view readings_json = g[field::kReadings].text;
    if (const auto packed = packed_of.find(gpu.host); packed != packed_of.end()) {
      static_json = readings_json = {};
      if (packed->second)
        if (const auto it = packed->second->find(uuid); it != packed->second->end()) {
          static_json = it->second.static_json;
          readings_json = it->second.readings_json;
        }
    }
    if (gpu.host == settings_.host) {
      const auto live = std::find_if(local_devices.begin(), local_devices.end(),
                                     [&](const Device& d) { return d.uuid == uuid; });
      if (live != local_devices.end()) {
        gpu.device = *live;
        gpu.local = true;
        if (auto registered = registered_device(static_json, readings_json);
            registered && registered->uuid == uuid)
          out.registered_here.emplace(uuid, std::move(*registered));
      }
    }
    if (!gpu.local) {
      auto device = registered_device(static_json, readings_json);
      if (!device || device->uuid != uuid) {
        out.warnings.push_back(fmt::format("the registration of GPU {} (host {}) is unreadable",
                                           sanitize_for_display(uuid, 80),
                                           sanitize_for_display(gpu.host, 64)));
        continue;
      }
      gpu.device = std::move(*device);
    }
    out.gpus.push_back(std::move(gpu));
  }
  sort_gpus(out.gpus);
}

void RedisBackend::read_snapshot_tickets(const RedisValue& tickets, Snapshot& out) {
  namespace queued = snapshot_reply::ticket;
  for (std::size_t i = 0; i + queued::kWidth <= tickets.elements.size(); i += queued::kWidth) {
    const RedisValue* t = &tickets.elements[i];
    const std::string& id = t[queued::kId].text;
    std::optional<Ticket> ticket = queued_ticket(t[queued::kBody].text);
    const auto seq = whole_number<double>(t[queued::kSeq].text);
    if (!ticket || ticket->id != id || !seq || *seq < 1 || *seq > 9e15) {
      out.warnings.push_back(
          fmt::format("queue entry {} is unreadable and ignored", sanitize_for_display(id, 40)));
      continue;
    }
    ticket->seq = static_cast<std::uint64_t>(*seq);
    out.ticket_uids.push_back(ticket->uid);
    out.ticket_ttl_ms.push_back(integer_of(t[queued::kTtlMs]));
    ticket->uid = plan_uid(ticket->user);
    if (const auto served = whole_number<std::int64_t>(t[queued::kServed].text))
      out.user_last_served[ticket->user] = *served;
    out.tickets.push_back(std::move(*ticket));
  }
}

RedisBackend::Snapshot RedisBackend::snapshot(RedisConnection& connection,
                                              const std::vector<std::string>& scope,
                                              const std::string& user,
                                              const std::vector<Device>& local_devices) {
  std::string hosts_arg;
  for (const auto& host : scope) hosts_arg += host + "\n";
  const RedisValue reply =
      connection.run(redis_scripts::kSnapshot, {settings_.version_key()},
                     {hosts_arg, user, std::to_string(settings_.lease_ttl.count())});
  namespace part = snapshot_reply;
  Snapshot out;
  out.version = element(reply, part::kVersion).text;
  out.now_ms = integer_of(element(reply, part::kNowMs));
  read_snapshot_gpus(element(reply, part::kHosts), element(reply, part::kGpus), local_devices, out);
  read_leases(element(reply, part::kLeases), out);
  read_snapshot_tickets(element(reply, part::kTickets), out);
  read_held_elsewhere(element(reply, part::kElsewhere), out);
  out.whole_pool = integer_of(element(reply, part::kWholePool)) != 0;
  out.server_us = parse_server_us(element(reply, part::kServerUs).text);
  out.frees = element(reply, part::kFrees).text;
  if (!user.empty())
    if (const auto served = whole_number<std::int64_t>(element(reply, part::kUserServed).text))
      out.user_last_served.emplace(user, *served);
  return out;
}

RedisBackend::Snapshot RedisBackend::registered_snapshot(RedisConnection& connection,
                                                         std::vector<std::string> scope,
                                                         const std::string& user,
                                                         std::vector<Device>& local_devices) {
  if (!scope.empty() && std::find(scope.begin(), scope.end(), settings_.host) == scope.end())
    scope.push_back(settings_.host);
  Snapshot snap = snapshot(connection, scope, user, local_devices);
  if (std::none_of(snap.hosts.begin(), snap.hosts.end(),
                   [&](const HostEntry& h) { return h.name == settings_.host; })) {
    // Our registration is gone (the server restarted empty): register again, at once rather
    // than when the cached registration is due.
    local_devices = register_devices(connection, /*force=*/true);
    snap = snapshot(connection, scope, user, local_devices);
  }
  return snap;
}

std::vector<std::string> RedisBackend::host_names(RedisConnection& connection) {
  const RedisValue reply = connection.command({"ZRANGE", settings_.prefix() + "hosts", "0", "-1"});
  std::vector<std::string> names;
  for (const RedisValue& name : reply.elements) names.push_back(name.text);
  return names;
}

QueueSnapshot RedisBackend::plan(const Snapshot& snap, const Ticket* newcomer) {
  QueueSnapshot q;
  q.tickets = snap.tickets;
  q.warnings = snap.warnings;
  if (newcomer) {
    q.tickets.push_back(*newcomer);
    q.tickets.back().seq = (snap.tickets.empty() ? 0 : snap.tickets.back().seq) + 1;
    q.tickets.back().uid = plan_uid(newcomer->user);
  }
  // Leases count by the user the acquire wrote, as a snapshot whose scope does not hold their
  // host counts them (held_elsewhere, shared_elsewhere); a lease of an older gpulock without
  // one, by its record.
  const auto owner = [&](const std::string& lease_id) -> std::optional<uid_t> {
    const auto it = snap.leases.find(lease_id);
    if (it == snap.leases.end()) return std::nullopt;
    if (!it->second.user.empty()) return plan_uid(it->second.user);
    if (it->second.record) return plan_uid(it->second.record->user);
    return std::nullopt;
  };
  std::map<std::string, const Gpu*> by_uuid;
  for (const Gpu& gpu : snap.gpus) {
    by_uuid[gpu.device.uuid] = &gpu;
    PlannedGpu planned{gpu.device.uuid, !gpu.lock.empty(), std::nullopt};
    LockState lock = lock_state_of(gpu, snap);
    if (!gpu.shared() && !gpu.lock.empty()) planned.holder_uid = owner(gpu.lock);
    // A shared lease weighs the part of the GPU's memory it reserves here.
    if (const std::uint64_t total = gpu.device.memory_total_bytes.value_or(0); total > 0)
      for (const Share& share : gpu.shares)
        if (const auto uid = owner(share.lease_id))
          planned.shared_by.emplace_back(*uid, shared_part(share.units, total));
    q.gpus.push_back(std::move(planned));
    q.locks.push_back(std::move(lock));
    q.gpu_names.push_back(gpu.local ? gpu.device.display_index()
                                    : gpu.host + "/" + gpu.device.display_index());
  }
  // GPUs held on hosts outside the snapshot's scope count in fair share and limits as held
  // GPUs no request can use (their placeholder UUIDs are nobody's candidates).
  for (const auto& [user, count] : snap.held_elsewhere) {
    LockState lock;
    lock.locked = true;
    for (unsigned i = 0; i < count; ++i) {
      q.gpus.push_back(PlannedGpu{fmt::format("elsewhere:{}:{}", user, i), true, plan_uid(user)});
      q.locks.push_back(lock);
      q.gpu_names.push_back("another host's GPU");
    }
  }
  for (const auto& [user, part] : snap.shared_elsewhere) {
    LockState lock;
    lock.locked = true;
    PlannedGpu gpu{fmt::format("elsewhere-shared:{}", user), true, std::nullopt};
    gpu.shared_by.emplace_back(plan_uid(user), part);
    q.gpus.push_back(std::move(gpu));
    q.locks.push_back(lock);
    q.gpu_names.push_back("another host's shared GPUs");
  }
  std::vector<PlanRequest> requests;
  for (std::size_t i = 0; i < q.tickets.size(); ++i) {
    const Ticket& t = q.tickets[i];
    PlanRequest r = plan_request_for(t, config_);
    if (newcomer && i + 1 == q.tickets.size()) r.limits.max_waiting.reset();
    if (const auto it = snap.user_last_served.find(t.user); it != snap.user_last_served.end())
      r.user_last_served = it->second;
    const auto& reasons =
        q.unhealthy_reasons.emplace_back(unhealthy_candidates(t, [&](const std::string& u) {
          const auto it = by_uuid.find(u);
          return it == by_uuid.end() ? nullptr : &it->second->device;
        }));
    for (const auto& [uuid, reason] : reasons) r.unhealthy.push_back(uuid);
    requests.push_back(std::move(r));
  }
  q.plan =
      plan_queue(config_.policy, q.gpus, requests, [&](const std::string& a, const std::string& b) {
        const auto ia = by_uuid.find(a), ib = by_uuid.find(b);
        if (ia == by_uuid.end() || ib == by_uuid.end()) return 1000;
        if (ia->second->host != ib->second->host) return 1000;
        return ia->second->local ? source_->distance(a, b) : 1;
      });
  return q;
}

bool RedisBackend::registration_misleads(const Snapshot& snap, const QueueSnapshot& planned) {
  // Only this host's GPUs that are free (or in shared use) can make plans disagree: a plan
  // gives a held GPU to nobody, however healthy.
  std::vector<RegisteredAndLive> gpus;
  for (const Gpu& gpu : snap.gpus) {
    if (!gpu.local || !(gpu.lock.empty() || gpu.shared())) continue;
    const auto as_registered = snap.registered_here.find(gpu.device.uuid);
    if (as_registered != snap.registered_here.end())
      gpus.push_back(RegisteredAndLive{&as_registered->second, &gpu.device});
  }
  return !gpus.empty() && health_verdicts_differ(planned.tickets, gpus);
}

}  // namespace gpulock
