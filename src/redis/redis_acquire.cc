// RedisBackend::ExclusiveRound: a round of an exclusive acquire on a Redis pool. Plan from a
// snapshot, take the planned GPUs with one atomic script, and otherwise wait in the pool's queue (a
// ticket renewed by heartbeats, blocked on its own wake list, which releases and other waiters'
// plans push to).
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "backend/lease_state.h"
#include "backend/process_holder_record.h"
#include "backend/queue_request.h"
#include "backend/queue_snapshot.h"
#include "backend/request_checks.h"
#include "gpulock/error.hpp"
#include "process/process_identity.h"
#include "redis/fencing_token.h"
#include "redis/redis_lease_keeper.h"
#include "redis/redis_round.h"
#include "redis/redis_scripts.h"
#include "redis/script_calls.h"
#include "redis/wake_message.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A waiter renews its ticket this often; a ticket not renewed for kTicketTtl (a dead waiter's)
// expires and leaves the queue.
constexpr milliseconds kHeartbeat{2000};
constexpr milliseconds kTicketTtl{6000};
// After a lock's TTL ends, its GPU is free without any message: wake this long after.
constexpr milliseconds kExpiryMargin{20};
// What a waiter that is leaving, maybe after a silent server timed out, gives the server to
// remove its ticket (which otherwise expires by itself within kTicketTtl).
constexpr milliseconds kLeaveTimeout{250};
// How much longer than a BLPOP's own timeout its reply may take to arrive.
constexpr milliseconds kWakeMargin{250};

// Blocks until the ticket's wake list has an entry (taking it) or `slice` passes: the wake (see
// wake_message.h), or nullopt. The socket may take a little longer than BLPOP's own timeout.
std::optional<std::string> wait_for_wake(RedisConnection& waker, const std::string& ticket_key,
                                         milliseconds slice) {
  if (slice < milliseconds(1)) {
    RedisValue reply = waker.command({"LPOP", ticket_key});
    if (reply.type != RedisValue::Type::kString) return std::nullopt;
    return std::move(reply.text);
  }
  waker.set_timeout(slice + kWakeMargin);
  RedisValue reply =
      waker.command({"BLPOP", ticket_key, fmt::format("{:.3f}", slice.count() / 1000.0)});
  if (reply.type != RedisValue::Type::kArray) return std::nullopt;
  if (reply.elements.size() != 2) return std::string();
  return std::move(reply.elements[1].text);
}

// An acquire script as sent: what makes a lease of its reply. Kept while its answer has not
// come, since the server may have run it and then gone away before answering: sent again with
// the same lease id once the server answers, it gets the first run's answer (or is refused, if
// that run never happened or its lease is gone), instead of its lease locking the GPUs, held by
// nobody, until its TTL ends.
struct SentAcquire {
  std::string lease_id;
  std::vector<LeasedGpu> gpus;
  std::string gpu_host;
  HolderRecord record;
  std::string record_json;
  std::chrono::system_clock::time_point started_at;
  AcquireArgs args;
  Clock::time_point sent;  // when it was first sent: its lease's TTL ran from after it
};

std::string join_names(const std::vector<std::string>& names) {
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

class RedisBackend::ExclusiveRound final : public RedisBackend::Round {
 public:
  ExclusiveRound(RedisBackend& pool, const LeaseRequest& request, const WaitHooks& hooks,
                 const AcquireWait& wait, std::string user);
  // Leaves the queue, however the acquire ends.
  ~ExclusiveRound() override { leave_queue(); }

  RoundOutcome look() override;
  // Until a wake pushed to the ticket's list is news, or the time look() chose; renews the
  // ticket meanwhile.
  void sleep(Clock::time_point deadline) override;

 private:
  bool answer_pending() const override { return unanswered_.has_value(); }
  bool server_answered() const override {
    return !connection_.broken() && !(waker_ && waker_->broken());
  }
  // An outage loses the wake connection, and the ticket may be gone when the server is back
  // (one still there, or back from an AOF or RDB, keeps its place: see adopt_returned_ticket).
  void before_retry() override {
    waker_.reset();
    ticket_id_.clear();
  }
  void after_retry() override;

  // Our ticket is in the snapshot though we hold none: the server restarted with its data.
  void adopt_returned_ticket(const Snapshot& snap);
  // The GPUs of the snapshot that could ever serve the request (for several GPUs, those of one
  // host, chosen once). Throws kUnsatisfiable when they are too few.
  std::vector<const Gpu*> candidates(const Snapshot& snap);
  // Registers this host's live readings where other hosts' plans would judge a ticket's health
  // otherwise than the plan `q` did.
  void push_readings_if_misleading(const Snapshot& snap, const QueueSnapshot& q);
  // The other waiters `q` serves now or lets in again; woken at once unless we take GPUs (the
  // acquire script wakes them, after it took ours).
  std::vector<std::string> wake_others(const Snapshot& snap, const QueueSnapshot& q, std::size_t me,
                                       const Placement& mine);
  // Runs the acquire script for `mine`'s GPUs; nullopt when the pool changed since `snap`.
  std::optional<Lease> take_placement(const Snapshot& snap, const Placement& mine,
                                      const std::vector<const Gpu*>& candidates,
                                      std::vector<std::string> to_wake);
  // Runs an acquire script and makes the lease of an "ok" reply; nullopt when refused.
  std::optional<Lease> take(const SentAcquire& acquire);
  // Joins the queue. Returns whether the plan `q` still stands afterwards (nothing changed
  // between the snapshot and the entry), so that no new look is needed.
  bool enter_queue(const Snapshot& snap, const QueueSnapshot& q, std::size_t me,
                   const Placement& mine);
  // Why the request is not served, and (in wake_at_'s distance) when to look again unwoken.
  NotServed explain(const Snapshot& snap, const QueueSnapshot& q, std::size_t me,
                    const std::vector<const Gpu*>& candidates);
  void leave_queue() noexcept;

  Ticket wanted_;  // this request as the queue sees it
  // Whether a max_waiting limit applies: a newcomer's plan then let it past the limit, so its
  // entry may change others' plans, and it plans again after entering.
  const bool waiting_limited_;
  // A second connection, on which a waiter blocks (BLPOP) on its ticket's wake list.
  std::unique_ptr<RedisConnection> waker_;
  std::string ticket_id_;  // our ticket while this request waits in the queue
  Clock::time_point next_heartbeat_;
  std::string chosen_host_;  // a multi-GPU request waits for the GPUs of one host
  PoolMoment planned_;       // the pool as the last plan saw it: older wakes are no news
  // When this host's readings may next be registered for other hosts' health filters (at most
  // once per health recheck, however often they flip).
  Clock::time_point next_readings_push_{};
  std::optional<SentAcquire> unanswered_;   // an acquire whose answer has not come
  std::chrono::milliseconds sleep_for_{0};  // how long explain() let the sleep last unwoken
};

std::unique_ptr<RedisBackend::Round> RedisBackend::exclusive_round(const LeaseRequest& request,
                                                                   const WaitHooks& hooks,
                                                                   const AcquireWait& wait,
                                                                   std::string user) {
  return std::make_unique<ExclusiveRound>(*this, request, hooks, wait, std::move(user));
}

RedisBackend::ExclusiveRound::ExclusiveRound(RedisBackend& pool, const LeaseRequest& request,
                                             const WaitHooks& hooks, const AcquireWait& wait,
                                             std::string user)
    : Round(pool, request, hooks, wait, std::move(user), "interrupted while waiting for GPUs"),
      wanted_(ticket_for_request(request, wait.needed, user_)),
      waiting_limited_(pool.config_.limits_for(user_).max_waiting.has_value()) {}

void RedisBackend::ExclusiveRound::leave_queue() noexcept {
  if (ticket_id_.empty()) return;
  try {
    connection_.reconnect(kLeaveTimeout);
    connection_->set_deadline(std::nullopt);  // the request's may have passed
    connection_->set_timeout(kLeaveTimeout);
    connection_->run(redis_scripts::kLeave, {pool_.settings_.version_key()}, {ticket_id_});
  } catch (const Error&) {
    // The server is gone: the ticket expires by itself within its TTL.
  }
  ticket_id_.clear();
}

void RedisBackend::ExclusiveRound::after_retry() {
  try {
    waker_ = RedisConnection::connect(pool_.settings_.endpoint,
                                      std::min(milliseconds(2000), calls_.connect_budget()));
  } catch (const Error&) {
    // Still unreachable: the next round fails the same way and comes back to recover().
    waker_.reset();
  }
}

std::optional<Lease> RedisBackend::ExclusiveRound::take(const SentAcquire& acquire) {
  const RedisSettings& settings = pool_.settings_;
  // Until it is answered, an outage is waited out, however long this request has waited: the
  // script may have run, and only the server can say so once it answers again.
  const RedisValue raw = run_until_answered(connection_, redis_scripts::kAcquire,
                                            {settings.version_key()}, acquire, &unanswered_);
  const AcquireReply reply = parse_acquire_reply(raw);
  // The script wrote nothing: no lock is left behind, and waiting cannot help.
  if (reply.outcome == "exhausted") fail(fencing_tokens_exhausted(settings, raw));
  if (reply.outcome != "ok" || reply.uuids.size() != acquire.gpus.size()) return std::nullopt;
  ticket_id_.clear();  // the script removed it
  const std::optional<std::uint64_t> token = parse_fencing_token(reply.token_text);
  if (!token) {
    // A garbage `token` key made a token that is no 64-bit count: give the GPUs back at once
    // rather than leave them locked until the TTL ends.
    cannot_retry();  // first: a release that goes unanswered is no outage either
    std::vector<std::string> release_args{acquire.lease_id};
    for (const LeasedGpu& g : acquire.gpus) release_args.push_back(g.uuid);
    connection_->run(redis_scripts::kRelease, {settings.version_key()}, release_args);
    fail(Error(
        ErrorCode::kEnvironment,
        fmt::format("pool '{}': its fencing-token counter ({}token) gave '{}', "
                    "which is not a 64-bit count, so the lease was given back; "
                    "an administrator must repair the key (see `gpulock doctor`)",
                    settings.pool, settings.prefix(), sanitize_for_display(reply.token_text, 40))));
  }
  auto lease = std::make_unique<LeaseState>();
  lease->id = acquire.lease_id;
  lease->gpus = acquire.gpus;
  lease->started_at = acquire.started_at;
  lease->record = acquire.record;
  RedisLeaseTerms terms{settings.version_key(), settings.lease_ttl,
                        acquire.lease_id,       *token,
                        acquire.record.gpus,    user_,
                        acquire.gpu_host,       {}};
  lease->keeper = std::make_unique<RedisLeaseKeeper>(std::move(terms), acquire.record_json,
                                                     pool_.connections_, acquire.sent);
  return Lease(std::move(lease));
}

void RedisBackend::ExclusiveRound::adopt_returned_ticket(const Snapshot& snap) {
  if (!ticket_id_.empty() || !has_waited_ ||
      std::none_of(snap.tickets.begin(), snap.tickets.end(),
                   [&](const Ticket& t) { return t.id == wanted_.id; }))
    return;
  // Our ticket is back after an outage (the server restarted with its data from an AOF or
  // RDB): keep its place, and renew it at once. Left alone, it would stay in the queue ahead of
  // everyone, given the free GPUs by every plan, until it expired silently.
  ticket_id_ = wanted_.id;
  next_heartbeat_ = Clock::now();
  if (!waker_) waker_ = RedisConnection::connect(pool_.settings_.endpoint, calls_.connect_budget());
}

std::vector<const RedisBackend::Gpu*> RedisBackend::ExclusiveRound::candidates(
    const Snapshot& snap) {
  const std::size_t needed = wait_.needed;
  for (const auto& host : scope_.hosts)
    if (std::none_of(snap.hosts.begin(), snap.hosts.end(),
                     [&](const HostEntry& h) { return h.name == host; }))
      throw Error(
          ErrorCode::kUnsatisfiable,
          fmt::format("no host '{}' in pool '{}' (hosts: {})", sanitize_for_display(host, 64),
                      pool_.settings_.pool, join_names(pool_.host_names(*connection_))));
  std::vector<const Gpu*> out;
  std::vector<std::string> never_reasons;
  for (const Gpu* g : request_gpus(snap.gpus, scope_, request_)) {
    std::string never = never_reason(g->device, request_, pool_.config_);
    if (never.empty() && g->local) never = outside_visible_reason(g->device, request_);
    if (never.empty() && !g->unusable_reason().empty())
      never = fmt::format("{} of host {}: {}", describe_device(g->device), g->host,
                          g->unusable_reason());
    if (!never.empty()) {
      if (!request_.gpus.empty()) throw Error(ErrorCode::kUnsatisfiable, never);
      never_reasons.push_back(never);
      continue;
    }
    out.push_back(g);
  }
  // A multi-GPU request is served from one host: the one with the most GPUs free for it now
  // (this host on a tie), chosen once.
  if (needed > 1 && request_.gpus.empty() && !scope_.one_host) {
    if (chosen_host_.empty()) {
      std::map<std::string, std::pair<std::size_t, std::size_t>> per_host;  // free, all
      for (const Gpu* g : out) {
        auto& [free, all] = per_host[g->host];
        ++all;
        if (g->lock.empty() && unready_reason(g->device, request_).empty()) ++free;
      }
      std::pair<std::size_t, int> best{0, -1};
      for (const auto& [host, counts] : per_host) {
        if (counts.second < needed) continue;
        const std::pair<std::size_t, int> score{counts.first, host == pool_.settings_.host ? 1 : 0};
        if (chosen_host_.empty() || score > best) {
          best = score;
          chosen_host_ = host;
        }
      }
    }
    std::erase_if(out, [&](const Gpu* g) { return g->host != chosen_host_; });
  }
  if (out.size() < needed)
    throw unsatisfiable(
        fmt::format("{} GPU{} requested but {} {} {} that can serve it{}", needed,
                    needed == 1 ? "" : "s", scope_.where, scope_.one_host ? "has" : "have",
                    out.size(), needed > 1 && !scope_.one_host ? " on one host" : ""),
        never_reasons);
  return out;
}

void RedisBackend::ExclusiveRound::push_readings_if_misleading(const Snapshot& snap,
                                                               const QueueSnapshot& q) {
  // Waiters on other hosts judge this host's GPUs by its registered readings: those of the
  // last gpulock process here to register (a waiter registers when it starts, not while it
  // waits). Where they would judge a ticket's health otherwise than the live readings this
  // plan used, plans disagree: each may leave a free GPU to a request the other thinks it
  // cannot serve, for as long as the registration stays old. Register the live readings,
  // before waking anyone, so that those woken plan as this one did.
  if (Clock::now() < next_readings_push_ || !registration_misleads(snap, q)) return;
  pool_.register_readings(*connection_, local_devices_, /*force=*/true);  // those this plan used
  next_readings_push_ = Clock::now() + pool_.options_.health_recheck_interval;
}

std::vector<std::string> RedisBackend::ExclusiveRound::wake_others(const Snapshot& snap,
                                                                   const QueueSnapshot& q,
                                                                   std::size_t me,
                                                                   const Placement& mine) {
  // Whoever plans wakes the other waiters the plan serves now (or lets in again): a release
  // wakes only the first waiters that may use its GPUs, and they pass the wake on. A request
  // served now wakes them from its acquire script, after it took its GPUs, so that they plan
  // from a pool with its lease in it (woken before it, their acquires were refused as stale);
  // the script wakes them when it refuses, too.
  std::vector<std::string> to_wake;
  for (const Placement& p : q.plan.order)
    if (p.request != me && p.request < snap.tickets.size() &&
        (p.standing == QueueStanding::kNext || p.may_enter))
      to_wake.push_back(q.tickets[p.request].id);
  if (!to_wake.empty() && mine.standing != QueueStanding::kNext)
    connection_->run(redis_scripts::kWake, {pool_.settings_.version_key()}, to_wake);
  return to_wake;
}

std::optional<Lease> RedisBackend::ExclusiveRound::take_placement(
    const Snapshot& snap, const Placement& mine, const std::vector<const Gpu*>& candidates,
    std::vector<std::string> to_wake) {
  std::vector<const Gpu*> chosen;
  for (const auto& uuid : mine.gpus)
    for (const Gpu* g : candidates)
      if (g->device.uuid == uuid) chosen.push_back(g);
  SentAcquire acquire;
  acquire.lease_id = make_lease_id();
  if (!chosen.empty()) acquire.gpu_host = chosen.front()->host;
  for (const Gpu* g : chosen)
    acquire.gpus.push_back(LeasedGpu{g->device.index, g->device.display_index(), g->device.uuid,
                                     g->device.name, g->device.is_mig_instance()});
  acquire.started_at = std::chrono::system_clock::now();
  acquire.record = process_holder_record(acquire.lease_id, ::geteuid(), user_, pool_.settings_.host,
                                         request_, acquire.started_at);
  for (const Gpu* g : chosen) acquire.record.gpus.push_back(g->device.uuid);
  acquire.record_json = holder_record_json(acquire.record);
  acquire.args.lease_id = acquire.lease_id;
  acquire.args.ttl = pool_.settings_.lease_ttl;
  acquire.args.expected_version = snap.version;
  acquire.args.record_json = acquire.record_json;
  acquire.args.user = user_;
  acquire.args.gpu_host = acquire.gpu_host;
  acquire.args.ticket_id = wanted_.id;  // our ticket, if the queue has it
  acquire.args.limited = limited_;
  acquire.args.to_wake = std::move(to_wake);
  acquire.args.gpus = acquire.record.gpus;
  acquire.sent = Clock::now();
  return take(acquire);
}

bool RedisBackend::ExclusiveRound::enter_queue(const Snapshot& snap, const QueueSnapshot& q,
                                               std::size_t me, const Placement& mine) {
  std::size_t waiting_now = 0;
  for (const Ticket& t : snap.tickets)
    if (t.user == user_ && !t.entered_over_limit) ++waiting_now;
  wanted_.entered_over_limit = waits_over_limit(waiting_now, user_, pool_.config_);
  // A wake pushed to the ticket's list stays there until read: none is missed.
  if (!waker_) waker_ = RedisConnection::connect(pool_.settings_.endpoint, calls_.connect_budget());
  // The hosts it may be served from, so that snapshots read their GPUs ("" = any).
  std::string ticket_hosts;
  if (!scope_.any_host)
    for (const auto& host : scope_.hosts) ticket_hosts += host + "\n";
  // Waiting from now on, even if the answer is lost: the server may have run the entry and
  // then died or restarted before answering. An outage is then waited out like any other, and
  // the ticket, if it is back, keeps its place.
  has_waited_ = true;
  // Last in the plan, served and reserving nothing, with no limit in play: the entry changes
  // no one's plan, and the script leaves the version as it is (if it still is the snapshot's),
  // so that a waiter's acquire planned at it is not refused as stale.
  const bool behind_everyone =
      mine.standing == QueueStanding::kWaiting && mine.gpus.empty() && mine.held_back.empty() &&
      q.plan.position_of[me] + 1 == q.plan.order.size() && !limited_ && !waiting_limited_;
  const EnterArgs entry{wanted_.id, kTicketTtl,     serialize_ticket(wanted_),
                        user_,      ticket_hosts,   snap.version,
                        snap.frees, behind_everyone};
  const EnterReply entered = parse_enter_reply(
      connection_->run(redis_scripts::kEnter, {pool_.settings_.version_key()}, entry.argv()));
  ticket_id_ = wanted_.id;
  next_heartbeat_ = Clock::now() + kHeartbeat;
  // Nothing changed between the snapshot and the entry (the version had not moved): the queue
  // is the one just planned, with this request at its back, so that plan stands and this
  // request goes to sleep without reading the queue again. A user under a max_waiting limit
  // plans again: the plan above let the newcomer past the limit. Others who entered so since
  // the snapshot (last, without moving the version) are not in the plan: the queue's length
  // tells.
  const bool planned_queue_stands =
      entered.complete && entered.unchanged &&
      entered.queued == static_cast<long long>(snap.tickets.size()) + 1 && !waiting_limited_;
  // The plan saw the pool as it is after the entry, too.
  if (planned_queue_stands)
    planned_ = PoolMoment{entered.version, parse_server_us(entered.server_us)};
  return planned_queue_stands;
}

NotServed RedisBackend::ExclusiveRound::explain(const Snapshot& snap, const QueueSnapshot& q,
                                                std::size_t me,
                                                const std::vector<const Gpu*>& candidates) {
  const std::vector<BlockingGpu> blocking = q.blocking(me);
  if (request_.enclosing_lease_id) {
    std::vector<std::string> own;
    for (const Gpu* g : candidates) {
      const int i = q.gpu_index(g->device.uuid);
      if (i >= 0 && q.locks[i].record &&
          q.locks[i].record->lease_id == *request_.enclosing_lease_id)
        own.push_back(q.gpu_names[i]);
    }
    check_enclosing_lease(own, candidates.size(), wait_.needed, *request_.enclosing_lease_id);
  }
  const std::string blocked_by = q.blocked_by(me, pool_.config_);
  const int position = static_cast<int>(q.plan.position_of[me]) + 1;
  const Placement& mine = q.plan.of(me);

  // Releases and departures wake the waiters they may serve; an expiring lock wakes nobody, so
  // wake when the first lock on our candidates ends. Readings that decide health are re-read as
  // often as the local backend does.
  sleep_for_ = q.health_dependent() ? pool_.options_.health_recheck_interval
                                    : pool_.options_.safety_recheck_interval;
  for (const Gpu* g : candidates)
    if (!g->lock.empty() && g->lock_ttl_ms >= 0)
      sleep_for_ = std::min(sleep_for_, milliseconds(g->lock_ttl_ms) + kExpiryMargin);
  // Nor is a ticket's: a request ahead that the plan gives (or reserves) free GPUs we could
  // use takes them at once if its waiter lives, waking us; if it is gone (killed, or a ticket
  // of before a restart, back from an AOF or RDB), wake when its ticket ends.
  for (std::size_t at = 0; at < q.plan.position_of[me]; ++at) {
    const Placement& ahead = q.plan.order[at];
    if (ahead.request >= snap.ticket_ttl_ms.size() || snap.ticket_ttl_ms[ahead.request] < 0)
      continue;
    const bool wants_ours = std::any_of(ahead.gpus.begin(), ahead.gpus.end(), [&](const auto& u) {
      return std::any_of(candidates.begin(), candidates.end(),
                         [&](const Gpu* g) { return g->device.uuid == u; });
    });
    if (wants_ours)
      sleep_for_ =
          std::min(sleep_for_, milliseconds(snap.ticket_ttl_ms[ahead.request]) + kExpiryMargin);
  }
  return NotServed{
      not_served(q, me, request_.wait, blocking, blocked_by),
      WaitProgress{
          {}, blocking, position, static_cast<int>(q.tickets.size()), mine.standing, blocked_by},
      fmt::format("{}\n{}", position, blocked_by)};
}

RoundOutcome RedisBackend::ExclusiveRound::look() {
  begin_look();
  if (unanswered_) {
    // The server went away before answering our acquire: ask again whether it ran.
    SentAcquire again = *unanswered_;
    again.args = again.args.resent();
    if (std::optional<Lease> lease = take(again)) return RoundOutcome::served(std::move(*lease));
  }
  // The hosts that may serve it (every host for `--host any`), and those of the queue's
  // tickets; limits and fair share count GPUs held elsewhere from per-user sets, this user's
  // too, so that its share and last service are those every plan sees.
  const Snapshot snap = pool_.registered_snapshot(
      *connection_, scope_.any_host ? std::vector<std::string>() : scope_.hosts, user_,
      local_devices_);
  planned_ = PoolMoment{snap.version, snap.server_us};
  adopt_returned_ticket(snap);

  // 1. Which GPUs could serve it at all.
  const std::vector<const Gpu*> serving = candidates(snap);
  wanted_.candidates.clear();
  for (const Gpu* g : serving) wanted_.candidates.push_back(g->device.uuid);

  // 2. Plan the pool's queue; take our GPUs if it says so.
  const QueueSnapshot q = pool_.plan(snap, ticket_id_.empty() ? &wanted_ : nullptr);
  std::size_t me = 0;
  while (me < q.tickets.size() && q.tickets[me].id != wanted_.id) ++me;
  if (me == q.tickets.size()) {
    // Our ticket expired (this process was stopped longer than its TTL): register again.
    ticket_id_.clear();
    return RoundOutcome::look_again();
  }
  push_readings_if_misleading(snap, q);
  const Placement& mine = q.plan.of(me);
  std::vector<std::string> to_wake = wake_others(snap, q, me, mine);
  if (mine.standing == QueueStanding::kNext) {
    if (std::optional<Lease> lease = take_placement(snap, mine, serving, std::move(to_wake)))
      return RoundOutcome::served(std::move(*lease));
    return RoundOutcome::look_again();  // the pool changed since the snapshot: plan again
  }
  if (!ticket_id_.empty() && mine.may_enter) {
    // Room in the queue now: join it at the back.
    connection_->run(redis_scripts::kLeave, {pool_.settings_.version_key()}, {ticket_id_});
    ticket_id_.clear();
    wanted_.entered_over_limit = false;
    wanted_.id = make_lease_id();
    return RoundOutcome::look_again();
  }
  if (request_.wait && ticket_id_.empty() && !enter_queue(snap, q, me, mine))
    return RoundOutcome::look_again();

  // 3. Not served now: explain why; the loop sleeps until something changes.
  return RoundOutcome::waits(explain(snap, q, me, serving));
}

void RedisBackend::ExclusiveRound::sleep(Clock::time_point deadline) {
  const auto wake_at = Clock::now() + sleep_for_;
  while (true) {
    const milliseconds slice = sleep_slice(std::min(wake_at, next_heartbeat_), deadline, hooks_);
    const std::optional<std::string> wake =
        wait_for_wake(*waker_, pool_.settings_.prefix() + "wake:" + ticket_id_, slice);
    bool woke = wake && wake_is_news(*wake, planned_);
    check_interrupted(hooks_, "interrupted while waiting for GPUs");
    const auto now = Clock::now();
    if (now >= next_heartbeat_) {
      const RedisValue renewed =
          connection_->run(redis_scripts::kHeartbeat, {pool_.settings_.version_key()},
                           {ticket_id_, std::to_string(kTicketTtl.count())});
      if (renewed.integer == 0) {
        ticket_id_.clear();  // it expired: register again
        woke = true;
      }
      next_heartbeat_ = now + kHeartbeat;
    }
    if (woke || now >= wake_at || now >= deadline || hooks_.progress_refresh) break;
  }
}

}  // namespace gpulock
