// RedisBackend::acquire_shared(): a shared lease on a Redis pool, as reservations of GPUs'
// memory taken all-or-nothing by one script (kAcquireShared in redis_scripts.h).
//
// As on the local backend, a shared request does not join the queue. It takes memory only while
// no ticket waits in the pool (the queue holds requests for whole GPUs, and they go first), so
// a stream of small jobs cannot starve an exclusive request: the shared leases drain and it is
// served. The script checks that rule, and the memory, atomically; this side reads the pool
// once per round to know which GPUs could fit, how much memory processes outside gpulock use
// there (from the device readings the hosts publish), and whom to name while it waits. A
// waiting shared request re-reads the pool every kSharedPoll: nothing in Redis tells it when
// memory frees, and memory used outside gpulock changes without any event.
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "backend/gpu_status.h"
#include "backend/lease_state.h"
#include "backend/process_holder_record.h"
#include "backend/request_checks.h"
#include "backend/shared_memory_units.h"
#include "gpulock/error.hpp"
#include "gpulock/parse.hpp"
#include "process/process_identity.h"
#include "redis/fencing_token.h"
#include "redis/redis_backend.h"
#include "redis/redis_call_budget.h"
#include "redis/redis_lease_keeper.h"
#include "redis/redis_outage.h"
#include "redis/redis_request_scope.h"
#include "redis/redis_scripts.h"
#include "redis/script_calls.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kSharedPoll{200};

// A GPU's memory in shared units (0 when unknown), capped at what a GPU may have.
std::uint64_t total_units(const Device& d) {
  return std::min(d.memory_total_bytes.value_or(0) / kSharedMemoryUnitBytes,
                  kSharedMemoryMostUnits);
}

// The units a request wants on a GPU of `total` units.
std::uint64_t wanted_units(const LeaseRequest& request, std::uint64_t total) {
  if (request.memory_bytes) return shared_memory_units(*request.memory_bytes);
  return std::max<std::uint64_t>(1, total / *request.slots);
}

std::uint64_t units_of(const std::string& text) {
  return whole_number<std::uint64_t>(text).value_or(0);
}

std::string describe_share(const LeaseRequest& request) {
  return request.memory_bytes ? format_size(*request.memory_bytes)
                              : fmt::format("1/{}", *request.slots);
}

// A candidate GPU as this round sees it.
struct SharedCandidate {
  const RedisBackend::Gpu* gpu = nullptr;
  std::uint64_t capacity = 0;  // units shared leases may hold in all
  std::uint64_t wanted = 0;    // units this request wants there
  std::uint64_t held = 0;      // units live reservations hold
  unsigned jobs = 0;
  std::size_t order = 0;
  std::uint64_t room() const { return capacity > held ? capacity - held : 0; }
};

// A shared acquire script as sent: what makes a lease of its reply. Kept while its answer has
// not come (the server may have run it and gone away before answering) and sent again, offering
// no room, once the server answers: the script gives the first run's answer if that lease is
// there, and otherwise takes nothing.
struct SentSharedAcquire {
  std::string lease_id;
  std::map<std::string, std::pair<LeasedGpu, std::string>> offered;  // by UUID, with its host
  HolderRecord record;                                               // as predicted
  std::string record_json;
  std::uint64_t predicted_units = 0;
  std::chrono::system_clock::time_point started_at;
  AcquireSharedArgs args;
  Clock::time_point sent;  // when it was first sent: its lease's TTL ran from after it
};

}  // namespace

Lease RedisBackend::acquire_shared(const LeaseRequest& request, const WaitHooks& hooks) {
  validate_request(request);
  if (request.memory_bytes && *request.memory_bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, "a shared lease's memory (--mem) must be more than 0");
  if (request.slots && *request.slots == 0)
    throw Error(ErrorCode::kInvalidArgument, "slots (--slots) must be at least 1");
  const auto start = Clock::now();
  const Clock::time_point deadline = wait_deadline(request, start);
  const std::size_t needed = request.gpus.empty() ? request.count : request.gpus.size();
  const std::string user = user_name(::geteuid());
  check_gpu_limit(needed, user, config_);
  std::optional<unsigned> cap = config_.max_jobs_per_gpu;
  if (request.slots) cap = cap ? std::min(*cap, *request.slots) : *request.slots;
  // Shared leases may share a GPU with processes outside gpulock: their memory is counted.
  LeaseRequest health = request;
  health.allow_foreign_processes = true;
  const bool limited = config_.limits_for(user).max_gpus.has_value();

  // Which hosts may serve it.
  const RequestHosts scope = request_hosts(request, settings_.host);
  const bool any_host = scope.any_host, one_host = scope.one_host;
  const std::vector<std::string>& hosts = scope.hosts;
  const std::string& where = scope.where;

  const RedisCallBudget calls(deadline, start);
  RedisConnectionLoan connection(*connections_, calls.connect_budget());
  connection->set_deadline(calls.deadline());
  std::vector<Device> local_devices = register_devices(*connection);
  const std::uint64_t reserve_units =
      config_.shared_memory_reserve_bytes == 0
          ? 0
          : shared_memory_units(config_.shared_memory_reserve_bytes);

  std::string last_progress;
  bool first_round = true;
  bool has_waited = false;  // went to sleep at least once, waiting for memory
  RedisOutage outage(hooks, "interrupted while waiting for GPU memory");
  bool retrying_cannot_help = false;            // an error of the pool's data, not of reaching it
  std::optional<SentSharedAcquire> unanswered;  // an acquire whose answer has not come

  // Runs an acquire script and makes the lease of an "ok" reply; else nullopt, with the
  // script's outcome in *outcome.
  const auto take = [&](const SentSharedAcquire& acquire,
                        std::string* outcome) -> std::optional<Lease> {
    // Until it is answered, an outage is waited out, even by a request that has not waited: the
    // script may have run, and only the server can say so once it answers again.
    const RedisValue raw = run_until_answered(connection, redis_scripts::kAcquireShared,
                                              {settings_.version_key()}, acquire, &unanswered);
    const AcquireReply reply = parse_acquire_shared_reply(raw);
    *outcome = reply.outcome;
    if (*outcome == "exhausted") {
      retrying_cannot_help = true;
      throw fencing_tokens_exhausted(settings_, raw);
    }
    if (*outcome != "ok" || reply.uuids.size() != needed) return std::nullopt;
    const std::vector<std::string>& uuids = reply.uuids;
    std::vector<std::uint64_t> units;
    std::vector<const std::pair<LeasedGpu, std::string>*> taken;
    for (std::size_t i = 0; i < uuids.size(); ++i) {
      units.push_back(units_of(reply.units[i]));
      if (const auto at = acquire.offered.find(uuids[i]); at != acquire.offered.end())
        taken.push_back(&at->second);
    }
    const std::optional<std::uint64_t> token = parse_fencing_token(reply.token_text);
    if (taken.size() != needed || !token) {
      retrying_cannot_help = true;  // first: a release that goes unanswered is no outage either
      connection->run(redis_scripts::kRelease, {settings_.version_key()}, {acquire.lease_id});
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("pool '{}': the shared acquire gave an unexpected reply (token "
                              "'{}'), so the lease was given back; see `gpulock doctor`",
                              settings_.pool, sanitize_for_display(reply.token_text, 40)));
    }
    // The script may have chosen other GPUs than predicted (the pool changed meanwhile): the
    // record then says what it holds, published with the first renewal.
    HolderRecord record = acquire.record;
    record.gpus = uuids;
    record.memory_bytes = units.front() * kSharedMemoryUnitBytes;
    const bool record_changed =
        record.gpus != acquire.record.gpus || units.front() != acquire.predicted_units;
    const std::string record_json =
        record_changed ? holder_record_json(record) : acquire.record_json;

    auto lease = std::make_unique<LeaseState>();
    lease->id = acquire.lease_id;
    for (const auto* gpu : taken) lease->gpus.push_back(gpu->first);
    lease->started_at = acquire.started_at;
    lease->record = record;
    RedisLeaseTerms terms{settings_.version_key(),
                          settings_.lease_ttl,
                          acquire.lease_id,
                          *token,
                          uuids,
                          user,
                          taken.front()->second,
                          units};
    auto keeper = std::make_unique<RedisLeaseKeeper>(std::move(terms), record_json, connections_,
                                                     acquire.sent);
    if (record_changed) keeper->publish_record(record);
    lease->keeper = std::move(keeper);
    return Lease(std::move(lease));
  };

  while (true) {
    // The round that starts at the deadline is the request's last look at the pool: its calls
    // get what is left of the deadline, so one may go unanswered (RedisOutage::fail_at_deadline).
    const bool last_look = Clock::now() >= deadline;
    try {
      if (!first_round) local_devices = source_->devices();  // fresh readings for the fit
      first_round = false;
      outage.end(connection, calls.connect_budget(), calls.deadline());
      if (unanswered) {
        // The server went away before answering our acquire: ask again whether it ran. Every
        // GPU is offered with no room, so that the script answers as the first run did if that
        // lease is there, and otherwise takes nothing (its readings are from before the outage):
        // the request then plans again from what the pool is now.
        SentSharedAcquire again = *unanswered;
        again.args = again.args.resent();
        std::string outcome;
        if (std::optional<Lease> lease = take(again, &outcome)) return std::move(*lease);
      }
      const Snapshot snap =
          registered_snapshot(*connection, any_host ? std::vector<std::string>() : hosts,
                              limited ? user : std::string(), local_devices);

      // 1. Which GPUs could serve it at all.
      for (const auto& host : hosts)
        if (std::none_of(snap.hosts.begin(), snap.hosts.end(),
                         [&](const HostEntry& h) { return h.name == host; }))
          throw Error(ErrorCode::kUnsatisfiable,
                      fmt::format("no host '{}' in pool '{}'", sanitize_for_display(host, 64),
                                  settings_.pool));
      const std::vector<const Gpu*> pool = request_gpus(snap.gpus, scope, request);
      std::vector<SharedCandidate> candidates;
      std::vector<std::string> never_reasons;
      for (const Gpu* g : pool) {
        const Device& d = g->device;
        std::string never = never_reason(d, health, config_);
        if (never.empty() && g->local) never = outside_visible_reason(d, request);
        if (never.empty() && !g->unusable_reason().empty())
          never =
              fmt::format("{} of host {}: {}", describe_device(d), g->host, g->unusable_reason());
        const std::uint64_t total = total_units(d);
        if (never.empty() && !d.memory_total_bytes)
          never =
              fmt::format("{} of host {}: its memory size is unknown", describe_device(d), g->host);
        if (never.empty() && wanted_units(request, total) + reserve_units > total)
          never = fmt::format("{} of host {}: {} of memory, {} of it kept in reserve",
                              describe_device(d), g->host, format_size(*d.memory_total_bytes),
                              format_size(config_.shared_memory_reserve_bytes));
        if (!never.empty()) {
          if (!request.gpus.empty()) throw Error(ErrorCode::kUnsatisfiable, never);
          never_reasons.push_back(never);
          continue;
        }
        SharedCandidate c;
        c.gpu = g;
        c.wanted = wanted_units(request, total);
        c.order = candidates.size();
        // Memory used outside gpulock: what the device reports, less what processes of the
        // shared leases use. This host's processes are matched to the leases' records; another
        // host's cannot be, so there its leases count as using all they reserve.
        const std::uint64_t used = d.memory_used_bytes.value_or(0);
        std::uint64_t covered = 0;
        if (g->shared()) {
          for (const Share& share : g->shares) {
            c.held += share.units;
            ++c.jobs;
          }
          const LockState lock = lock_state_of(*g, snap);
          if (g->local) {
            for (const HolderRecord& record : lock.shared_records)
              if (record.host == settings_.host)
                for (const GpuProcess& p : d.processes)
                  if (p.used_memory_bytes && covered_by(p.pid, record))
                    covered += *p.used_memory_bytes;
          } else {
            covered = std::min(used, lock.shared_reserved_bytes);
          }
        }
        const std::uint64_t outside_bytes =
            config_.shared_memory_reserve_bytes + (used > covered ? used - covered : 0);
        const std::uint64_t outside = outside_bytes == 0 ? 0 : shared_memory_units(outside_bytes);
        c.capacity = total > outside ? total - outside : 0;
        candidates.push_back(c);
      }
      if (candidates.size() < needed)
        throw unsatisfiable(
            fmt::format("{} GPU{} with {} requested but {} {} {} that can serve it{}", needed,
                        needed == 1 ? "" : "s", describe_share(request), where,
                        one_host ? "has" : "have", candidates.size(),
                        needed > 1 && !one_host ? " on one host" : ""),
            never_reasons);

      // 2. Which would fit now, as the script will choose them: on one host, packed or spread.
      std::string blocked_by;
      std::vector<SharedCandidate> chosen;
      std::vector<const SharedCandidate*> ready;  // not held exclusively, and healthy now
      for (const SharedCandidate& c : candidates)
        if ((c.gpu->lock.empty() || c.gpu->shared()) &&
            unready_reason(c.gpu->device, health).empty())
          ready.push_back(&c);
      if (!snap.tickets.empty()) {
        blocked_by = "requests for whole GPUs wait in the queue (they go first)";
      } else {
        std::map<std::string, std::vector<SharedCandidate>> fitting;
        std::vector<std::string> host_order;
        for (const SharedCandidate* c : ready) {
          if (c->room() < c->wanted || (cap && c->jobs >= *cap)) continue;
          if (!fitting.contains(c->gpu->host)) host_order.push_back(c->gpu->host);
          fitting[c->gpu->host].push_back(*c);
        }
        for (const auto& host : host_order) {
          std::vector<SharedCandidate>& list = fitting[host];
          if (list.size() < needed) continue;
          std::stable_sort(list.begin(), list.end(),
                           [&](const SharedCandidate& a, const SharedCandidate& b) {
                             return request.spread ? a.room() > b.room() : a.room() < b.room();
                           });
          list.resize(needed);
          chosen = list;
          break;
        }
        if (chosen.empty())
          blocked_by = fmt::format("not enough free GPU memory ({} needed on {} GPU{})",
                                   describe_share(request), needed, needed == 1 ? "" : "s");
      }

      // 3. Take them, if the pool still agrees (the script checks it all again).
      if (!chosen.empty()) {
        SentSharedAcquire acquire;
        acquire.lease_id = make_lease_id();
        acquire.started_at = std::chrono::system_clock::now();
        acquire.record = process_holder_record(acquire.lease_id, ::geteuid(), user, settings_.host,
                                               request, acquire.started_at);
        acquire.predicted_units = chosen.front().wanted;
        acquire.record.memory_bytes = acquire.predicted_units * kSharedMemoryUnitBytes;
        for (const SharedCandidate& c : chosen) acquire.record.gpus.push_back(c.gpu->device.uuid);
        acquire.record_json = holder_record_json(acquire.record);

        acquire.args.lease_id = acquire.lease_id;
        acquire.args.ttl = settings_.lease_ttl;
        acquire.args.record_json = acquire.record_json;
        acquire.args.user = user;
        acquire.args.needed = needed;
        acquire.args.cap = cap;
        acquire.args.spread = request.spread;
        acquire.args.limited = limited;
        // The predicted choice first, then the other ready candidates: the script takes the
        // first host where enough fit, in its own order, from what it finds.
        std::vector<const SharedCandidate*> offered;
        for (const SharedCandidate& c : chosen) offered.push_back(&c);
        for (const SharedCandidate* c : ready)
          if (std::none_of(chosen.begin(), chosen.end(),
                           [&](const SharedCandidate& x) { return x.gpu == c->gpu; }))
            offered.push_back(c);
        for (const SharedCandidate* c : offered) {
          const Device& d = c->gpu->device;
          acquire.args.offers.push_back(SharedOffer{d.uuid, c->gpu->host, c->capacity, c->wanted});
          acquire.offered[d.uuid] = {
              LeasedGpu{d.index, d.display_index(), d.uuid, d.name, d.is_mig_instance(),
                        d.memory_total_bytes.value_or(0)},
              c->gpu->host};
        }
        acquire.sent = Clock::now();
        std::string outcome;
        if (std::optional<Lease> lease = take(acquire, &outcome)) return std::move(*lease);
        if (outcome == "queue") {
          blocked_by = "requests for whole GPUs wait in the queue (they go first)";
        } else if (outcome == "busy") {
          continue;  // the pool changed since the snapshot: read it again
        } else {
          retrying_cannot_help = true;
          throw Error(ErrorCode::kEnvironment,
                      fmt::format("pool '{}': the shared acquire script gave an unexpected reply",
                                  settings_.pool));
        }
      }

      // 4. Not served now: say why, then look again a little later.
      Error refusal(ErrorCode::kTimedOut,
                    fmt::format("{}: {}",
                                request.wait ? "no GPU memory became available within the timeout"
                                             : "the requested GPU memory is not free now",
                                blocked_by));
      if (!request.wait || Clock::now() >= deadline) throw refusal;
      outage.left_waiting(std::move(refusal));
      if (hooks.on_progress && (blocked_by != last_progress || hooks.progress_refresh)) {
        last_progress = blocked_by;
        hooks.on_progress(WaitProgress{Clock::now() - start,
                                       {},
                                       0,
                                       static_cast<int>(snap.tickets.size()),
                                       QueueStanding::kWaiting,
                                       blocked_by});
      }
      has_waited = true;
      outage.sleep_until(std::min(deadline, Clock::now() + kSharedPoll));
    } catch (const Error& error) {
      // Redis went away while this request waits for memory, or before it answered an acquire:
      // keep waiting, retrying every second until the deadline. Before either, an unreachable
      // server is an error (exit 69).
      if (error.code() != ErrorCode::kEnvironment || !(has_waited || unanswered) ||
          retrying_cannot_help)
        throw;
      if (Clock::now() >= deadline) outage.fail_at_deadline(error, last_look && !unanswered);
      outage.wait_to_retry(error, deadline, !connection.broken());
    }
  }
}

}  // namespace gpulock
