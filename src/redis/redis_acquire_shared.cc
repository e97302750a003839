// RedisBackend::SharedRound: a round of a shared lease's acquire on a Redis pool, as reservations
// of GPUs' memory taken all-or-nothing by one script (kAcquireShared in redis_scripts.h).
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
#include "redis/redis_lease_keeper.h"
#include "redis/redis_round.h"
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

class RedisBackend::SharedRound final : public RedisBackend::Round {
 public:
  SharedRound(RedisBackend& pool, const LeaseRequest& request, const WaitHooks& hooks,
              const AcquireWait& wait, std::string user);

  RoundOutcome look() override;
  // Nothing in Redis tells a shared request when memory frees: it looks again every kSharedPoll.
  void sleep(Clock::time_point deadline) override {
    has_waited_ = true;
    outage_.sleep_until(std::min(deadline, Clock::now() + kSharedPoll));
  }

 private:
  bool answer_pending() const override { return unanswered_.has_value(); }
  // The GPUs of the snapshot that could ever serve the request, with what they have free for it.
  // Throws kUnsatisfiable when they are too few.
  std::vector<SharedCandidate> candidates(const Snapshot& snap) const;
  // Which of `ready` would fit now, as the script will choose them: on one host, packed or
  // spread. Empty when none do.
  std::vector<SharedCandidate> choose(const std::vector<const SharedCandidate*>& ready) const;
  // The acquire script for `chosen`, offering the other ready candidates after them.
  SentSharedAcquire prepare(const std::vector<SharedCandidate>& chosen,
                            const std::vector<const SharedCandidate*>& ready) const;
  // Runs an acquire script and makes the lease of an "ok" reply; else nullopt, with the
  // script's outcome in *outcome.
  std::optional<Lease> take(const SentSharedAcquire& acquire, std::string* outcome);

  std::optional<unsigned> cap_;  // the most shared leases a GPU may have, with this request
  // The request as health filters judge it: shared leases may share a GPU with processes
  // outside gpulock, whose memory is counted.
  LeaseRequest health_;
  std::uint64_t reserve_units_ = 0;
  std::optional<SentSharedAcquire> unanswered_;  // an acquire whose answer has not come
};

void RedisBackend::check_shared_request(const LeaseRequest& request) {
  if (request.memory_bytes && *request.memory_bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, "a shared lease's memory (--mem) must be more than 0");
  if (request.slots && *request.slots == 0)
    throw Error(ErrorCode::kInvalidArgument, "slots (--slots) must be at least 1");
}

std::unique_ptr<RedisBackend::Round> RedisBackend::shared_round(const LeaseRequest& request,
                                                                const WaitHooks& hooks,
                                                                const AcquireWait& wait,
                                                                std::string user) {
  return std::make_unique<SharedRound>(*this, request, hooks, wait, std::move(user));
}

RedisBackend::SharedRound::SharedRound(RedisBackend& pool, const LeaseRequest& request,
                                       const WaitHooks& hooks, const AcquireWait& wait,
                                       std::string user)
    : Round(pool, request, hooks, wait, std::move(user),
            "interrupted while waiting for GPU memory"),
      cap_(pool.config_.max_jobs_per_gpu),
      health_(request),
      reserve_units_(pool.config_.shared_memory_reserve_bytes == 0
                         ? 0
                         : shared_memory_units(pool.config_.shared_memory_reserve_bytes)) {
  if (request.slots) cap_ = cap_ ? std::min(*cap_, *request.slots) : *request.slots;
  health_.allow_foreign_processes = true;
}

std::optional<Lease> RedisBackend::SharedRound::take(const SentSharedAcquire& acquire,
                                                     std::string* outcome) {
  const RedisSettings& settings = pool_.settings_;
  const std::size_t needed = wait_.needed;
  // Until it is answered, an outage is waited out, even by a request that has not waited: the
  // script may have run, and only the server can say so once it answers again.
  const RedisValue raw = run_until_answered(connection_, redis_scripts::kAcquireShared,
                                            {settings.version_key()}, acquire, &unanswered_);
  const AcquireReply reply = parse_acquire_shared_reply(raw);
  *outcome = reply.outcome;
  if (*outcome == "exhausted") fail(fencing_tokens_exhausted(settings, raw));
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
    cannot_retry();  // first: a release that goes unanswered is no outage either
    connection_->run(redis_scripts::kRelease, {settings.version_key()}, {acquire.lease_id});
    fail(Error(ErrorCode::kEnvironment,
               fmt::format("pool '{}': the shared acquire gave an unexpected reply (token "
                           "'{}'), so the lease was given back; see `gpulock doctor`",
                           settings.pool, sanitize_for_display(reply.token_text, 40))));
  }
  // The script may have chosen other GPUs than predicted (the pool changed meanwhile): the
  // record then says what it holds, published with the first renewal.
  HolderRecord record = acquire.record;
  record.gpus = uuids;
  record.memory_bytes = units.front() * kSharedMemoryUnitBytes;
  const bool record_changed =
      record.gpus != acquire.record.gpus || units.front() != acquire.predicted_units;
  const std::string record_json = record_changed ? holder_record_json(record) : acquire.record_json;

  auto lease = std::make_unique<LeaseState>();
  lease->id = acquire.lease_id;
  for (const auto* gpu : taken) lease->gpus.push_back(gpu->first);
  lease->started_at = acquire.started_at;
  lease->record = record;
  RedisLeaseTerms terms{settings.version_key(),
                        settings.lease_ttl,
                        acquire.lease_id,
                        *token,
                        uuids,
                        user_,
                        taken.front()->second,
                        units};
  auto keeper = std::make_unique<RedisLeaseKeeper>(std::move(terms), record_json,
                                                   pool_.connections_, acquire.sent);
  if (record_changed) keeper->publish_record(record);
  lease->keeper = std::move(keeper);
  return Lease(std::move(lease));
}

std::vector<SharedCandidate> RedisBackend::SharedRound::candidates(const Snapshot& snap) const {
  const Config& config = pool_.config_;
  const std::size_t needed = wait_.needed;
  for (const auto& host : scope_.hosts)
    if (std::none_of(snap.hosts.begin(), snap.hosts.end(),
                     [&](const HostEntry& h) { return h.name == host; }))
      throw Error(ErrorCode::kUnsatisfiable,
                  fmt::format("no host '{}' in pool '{}'", sanitize_for_display(host, 64),
                              pool_.settings_.pool));
  std::vector<SharedCandidate> out;
  std::vector<std::string> never_reasons;
  for (const Gpu* g : request_gpus(snap.gpus, scope_, request_)) {
    const Device& d = g->device;
    std::string never = never_reason(d, health_, config);
    if (never.empty() && g->local) never = outside_visible_reason(d, request_);
    if (never.empty() && !g->unusable_reason().empty())
      never = fmt::format("{} of host {}: {}", describe_device(d), g->host, g->unusable_reason());
    const std::uint64_t total = total_units(d);
    if (never.empty() && !d.memory_total_bytes)
      never = fmt::format("{} of host {}: its memory size is unknown", describe_device(d), g->host);
    if (never.empty() && wanted_units(request_, total) + reserve_units_ > total)
      never = fmt::format("{} of host {}: {} of memory, {} of it kept in reserve",
                          describe_device(d), g->host, format_size(*d.memory_total_bytes),
                          format_size(config.shared_memory_reserve_bytes));
    if (!never.empty()) {
      if (!request_.gpus.empty()) throw Error(ErrorCode::kUnsatisfiable, never);
      never_reasons.push_back(never);
      continue;
    }
    SharedCandidate c;
    c.gpu = g;
    c.wanted = wanted_units(request_, total);
    c.order = out.size();
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
      const LockState lock = pool_.lock_state_of(*g, snap);
      if (g->local) {
        for (const HolderRecord& record : lock.shared_records)
          if (record.host == pool_.settings_.host)
            for (const GpuProcess& p : d.processes)
              if (p.used_memory_bytes && covered_by(p.pid, record)) covered += *p.used_memory_bytes;
      } else {
        covered = std::min(used, lock.shared_reserved_bytes);
      }
    }
    const std::uint64_t outside_bytes =
        config.shared_memory_reserve_bytes + (used > covered ? used - covered : 0);
    const std::uint64_t outside = outside_bytes == 0 ? 0 : shared_memory_units(outside_bytes);
    c.capacity = total > outside ? total - outside : 0;
    out.push_back(c);
  }
  if (out.size() < needed)
    throw unsatisfiable(fmt::format("{} GPU{} with {} requested but {} {} {} that can serve it{}",
                                    needed, needed == 1 ? "" : "s", describe_share(request_),
                                    scope_.where, scope_.one_host ? "has" : "have", out.size(),
                                    needed > 1 && !scope_.one_host ? " on one host" : ""),
                        never_reasons);
  return out;
}

std::vector<SharedCandidate> RedisBackend::SharedRound::choose(
    const std::vector<const SharedCandidate*>& ready) const {
  std::map<std::string, std::vector<SharedCandidate>> fitting;
  std::vector<std::string> host_order;
  for (const SharedCandidate* c : ready) {
    if (c->room() < c->wanted || (cap_ && c->jobs >= *cap_)) continue;
    if (!fitting.contains(c->gpu->host)) host_order.push_back(c->gpu->host);
    fitting[c->gpu->host].push_back(*c);
  }
  for (const auto& host : host_order) {
    std::vector<SharedCandidate>& list = fitting[host];
    if (list.size() < wait_.needed) continue;
    std::stable_sort(list.begin(), list.end(),
                     [&](const SharedCandidate& a, const SharedCandidate& b) {
                       return request_.spread ? a.room() > b.room() : a.room() < b.room();
                     });
    list.resize(wait_.needed);
    return list;
  }
  return {};
}

SentSharedAcquire RedisBackend::SharedRound::prepare(
    const std::vector<SharedCandidate>& chosen,
    const std::vector<const SharedCandidate*>& ready) const {
  const RedisSettings& settings = pool_.settings_;
  SentSharedAcquire acquire;
  acquire.lease_id = make_lease_id();
  acquire.started_at = std::chrono::system_clock::now();
  acquire.record = process_holder_record(acquire.lease_id, ::geteuid(), user_, settings.host,
                                         request_, acquire.started_at);
  acquire.predicted_units = chosen.front().wanted;
  acquire.record.memory_bytes = acquire.predicted_units * kSharedMemoryUnitBytes;
  for (const SharedCandidate& c : chosen) acquire.record.gpus.push_back(c.gpu->device.uuid);
  acquire.record_json = holder_record_json(acquire.record);

  acquire.args.lease_id = acquire.lease_id;
  acquire.args.ttl = settings.lease_ttl;
  acquire.args.record_json = acquire.record_json;
  acquire.args.user = user_;
  acquire.args.needed = wait_.needed;
  acquire.args.cap = cap_;
  acquire.args.spread = request_.spread;
  acquire.args.limited = limited_;
  // The predicted choice first, then the other ready candidates: the script takes the first
  // host where enough fit, in its own order, from what it finds.
  std::vector<const SharedCandidate*> offered;
  for (const SharedCandidate& c : chosen) offered.push_back(&c);
  for (const SharedCandidate* c : ready)
    if (std::none_of(chosen.begin(), chosen.end(),
                     [&](const SharedCandidate& x) { return x.gpu == c->gpu; }))
      offered.push_back(c);
  for (const SharedCandidate* c : offered) {
    const Device& d = c->gpu->device;
    acquire.args.offers.push_back(SharedOffer{d.uuid, c->gpu->host, c->capacity, c->wanted});
    acquire.offered[d.uuid] = {LeasedGpu{d.index, d.display_index(), d.uuid, d.name,
                                         d.is_mig_instance(), d.memory_total_bytes.value_or(0)},
                               c->gpu->host};
  }
  return acquire;
}

RoundOutcome RedisBackend::SharedRound::look() {
  begin_look();
  if (unanswered_) {
    // The server went away before answering our acquire: ask again whether it ran. Every GPU
    // is offered with no room, so that the script answers as the first run did if that lease is
    // there, and otherwise takes nothing (its readings are from before the outage): the
    // request then plans again from what the pool is now.
    SentSharedAcquire again = *unanswered_;
    again.args = again.args.resent();
    std::string outcome;
    if (std::optional<Lease> lease = take(again, &outcome))
      return RoundOutcome::served(std::move(*lease));
  }
  const Snapshot snap = pool_.registered_snapshot(
      *connection_, scope_.any_host ? std::vector<std::string>() : scope_.hosts,
      limited_ ? user_ : std::string(), local_devices_);

  // 1. Which GPUs could serve it at all.
  const std::vector<SharedCandidate> serving = candidates(snap);

  // 2. Which would fit now. The queue holds requests for whole GPUs, and they go first.
  const char* const queue_first = "requests for whole GPUs wait in the queue (they go first)";
  std::string blocked_by;
  std::vector<const SharedCandidate*> ready;  // not held exclusively, and healthy now
  for (const SharedCandidate& c : serving)
    if ((c.gpu->lock.empty() || c.gpu->shared()) && unready_reason(c.gpu->device, health_).empty())
      ready.push_back(&c);
  const std::vector<SharedCandidate> chosen =
      snap.tickets.empty() ? choose(ready) : std::vector<SharedCandidate>();
  if (!snap.tickets.empty())
    blocked_by = queue_first;
  else if (chosen.empty())
    blocked_by = fmt::format("not enough free GPU memory ({} needed on {} GPU{})",
                             describe_share(request_), wait_.needed, wait_.needed == 1 ? "" : "s");

  // 3. Take them, if the pool still agrees (the script checks it all again).
  if (!chosen.empty()) {
    SentSharedAcquire acquire = prepare(chosen, ready);
    acquire.sent = Clock::now();
    std::string outcome;
    if (std::optional<Lease> lease = take(acquire, &outcome))
      return RoundOutcome::served(std::move(*lease));
    if (outcome == "busy") return RoundOutcome::look_again();  // the pool changed: read it again
    if (outcome != "queue")
      fail(Error(ErrorCode::kEnvironment,
                 fmt::format("pool '{}': the shared acquire script gave an unexpected reply",
                             pool_.settings_.pool)));
    blocked_by = queue_first;
  }

  // 4. Not served now: say why; the loop looks again a little later.
  Error refusal(ErrorCode::kTimedOut,
                fmt::format("{}: {}",
                            request_.wait ? "no GPU memory became available within the timeout"
                                          : "the requested GPU memory is not free now",
                            blocked_by));
  WaitProgress progress{
      {}, {}, 0, static_cast<int>(snap.tickets.size()), QueueStanding::kWaiting, blocked_by};
  return RoundOutcome::waits(NotServed{std::move(refusal), std::move(progress), blocked_by});
}

}  // namespace gpulock
