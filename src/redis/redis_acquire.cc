// RedisBackend::acquire(): plan from a snapshot, take the planned GPUs with one atomic script, and
// otherwise wait in the pool's queue (a ticket renewed by heartbeats, blocked on its own wake
// list, which releases and other waiters' plans push to).
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
#include "redis/redis_backend.h"
#include "redis/redis_call_budget.h"
#include "redis/redis_lease_keeper.h"
#include "redis/redis_outage.h"
#include "redis/redis_request_scope.h"
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

Lease RedisBackend::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  if (request.memory_bytes || request.slots) return acquire_shared(request, hooks);
  validate_request(request);
  const auto start = Clock::now();
  const Clock::time_point deadline = wait_deadline(request, start);
  const std::size_t needed = request.gpus.empty() ? request.count : request.gpus.size();
  const std::string user = user_name(::geteuid());
  check_gpu_limit(needed, user, config_);

  // Which hosts may serve it.
  const RequestHosts scope = request_hosts(request, settings_.host);
  const bool any_host = scope.any_host, one_host = scope.one_host;
  const std::vector<std::string>& hosts = scope.hosts;
  const std::string& where = scope.where;

  Ticket wanted = ticket_for_request(request, needed, user);
  // Whether plans count the user's GPUs against a limit: then they need the GPUs the user holds
  // on every host, and any acquire makes concurrent plans stale, not only those of a queue.
  const bool limited = config_.limits_for(user).max_gpus.has_value();
  // Whether a max_waiting limit applies: a newcomer's plan then let it past the limit, so its
  // entry may change others' plans, and it plans again after entering.
  const bool waiting_limited = config_.limits_for(user).max_waiting.has_value();

  const RedisCallBudget calls(deadline, start);
  const std::optional<Clock::time_point>& calls_deadline = calls.deadline();
  RedisConnectionLoan connection(*connections_, calls.connect_budget());
  connection->set_deadline(calls_deadline);
  std::vector<Device> local_devices = register_devices(*connection);
  // A second connection, on which a waiter blocks (BLPOP) on its ticket's wake list.
  std::unique_ptr<RedisConnection> waker;
  // The ticket while this request waits in the queue; it leaves the queue however we return.
  struct TicketGuard {
    RedisBackend& pool;
    RedisConnectionLoan& connection;
    std::string id;
    ~TicketGuard() {
      if (id.empty()) return;
      try {
        connection.reconnect(kLeaveTimeout);
        connection->set_deadline(std::nullopt);  // the request's may have passed
        connection->set_timeout(kLeaveTimeout);
        connection->run(redis_scripts::kLeave, {pool.settings().version_key()}, {id});
      } catch (const Error&) {
        // The server is gone: the ticket expires by itself within its TTL.
      }
    }
  } ticket{*this, connection, ""};
  Clock::time_point next_heartbeat;
  std::string chosen_host;  // a multi-GPU request waits for the GPUs of one host
  std::string last_progress;
  bool first_round = true;
  RedisOutage outage(hooks, "interrupted while waiting for GPUs");
  bool has_waited = false;      // asked to join the queue at least once
  bool token_unusable = false;  // the pool's token counter is unusable: retrying cannot help
  PoolMoment planned;           // the pool as the last plan saw it: older wakes are no news
  // When this host's readings may next be registered for other hosts' health filters (at most
  // once per health recheck, however often they flip).
  Clock::time_point next_readings_push{};
  std::optional<SentAcquire> unanswered;  // an acquire whose answer has not come

  // Runs an acquire script and makes the lease of an "ok" reply; nullopt when refused.
  const auto take = [&](const SentAcquire& acquire) -> std::optional<Lease> {
    // Until it is answered, an outage is waited out, however long this request has waited: the
    // script may have run, and only the server can say so once it answers again.
    const RedisValue raw = run_until_answered(connection, redis_scripts::kAcquire,
                                              {settings_.version_key()}, acquire, &unanswered);
    const AcquireReply reply = parse_acquire_reply(raw);
    if (reply.outcome == "exhausted") {
      // The script wrote nothing: no lock is left behind, and waiting cannot help.
      token_unusable = true;
      throw fencing_tokens_exhausted(settings_, raw);
    }
    if (reply.outcome != "ok" || reply.uuids.size() != acquire.gpus.size()) return std::nullopt;
    ticket.id.clear();  // the script removed it
    const std::optional<std::uint64_t> token = parse_fencing_token(reply.token_text);
    if (!token) {
      // A garbage `token` key made a token that is no 64-bit count: give the GPUs back at once
      // rather than leave them locked until the TTL ends.
      token_unusable = true;  // first: a release that goes unanswered is no outage either
      std::vector<std::string> release_args{acquire.lease_id};
      for (const LeasedGpu& g : acquire.gpus) release_args.push_back(g.uuid);
      connection->run(redis_scripts::kRelease, {settings_.version_key()}, release_args);
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("pool '{}': its fencing-token counter ({}token) gave '{}', "
                              "which is not a 64-bit count, so the lease was given back; "
                              "an administrator must repair the key (see `gpulock doctor`)",
                              settings_.pool, settings_.prefix(),
                              sanitize_for_display(reply.token_text, 40)));
    }
    auto lease = std::make_unique<LeaseState>();
    lease->id = acquire.lease_id;
    lease->gpus = acquire.gpus;
    lease->started_at = acquire.started_at;
    lease->record = acquire.record;
    RedisLeaseTerms terms{settings_.version_key(), settings_.lease_ttl,
                          acquire.lease_id,        *token,
                          acquire.record.gpus,     user,
                          acquire.gpu_host,        {}};
    lease->keeper = std::make_unique<RedisLeaseKeeper>(std::move(terms), acquire.record_json,
                                                       connections_, acquire.sent);
    return Lease(std::move(lease));
  };

  while (true) {
    // The round that starts at the deadline is the request's last look at the pool: its calls
    // get what is left of the deadline, so one may go unanswered (RedisOutage::fail_at_deadline).
    const bool last_look = Clock::now() >= deadline;
    try {
      if (!first_round) local_devices = source_->devices();  // fresh readings for health filters
      first_round = false;
      // Back after an outage? (A server that restarted empty gets our registration again from
      // registered_snapshot below.)
      outage.end(connection, calls.connect_budget(), calls_deadline);
      if (unanswered) {
        // The server went away before answering our acquire: ask again whether it ran.
        SentAcquire again = *unanswered;
        again.args = again.args.resent();
        if (std::optional<Lease> lease = take(again)) return std::move(*lease);
      }
      // The hosts that may serve it (every host for `--host any`), and those of the queue's
      // tickets; limits and fair share count GPUs held elsewhere from per-user sets, this
      // user's too, so that its share and last service are those every plan sees.
      const Snapshot snap = registered_snapshot(
          *connection, any_host ? std::vector<std::string>() : hosts, user, local_devices);
      planned = PoolMoment{snap.version, snap.server_us};
      if (ticket.id.empty() && has_waited &&
          std::any_of(snap.tickets.begin(), snap.tickets.end(),
                      [&](const Ticket& t) { return t.id == wanted.id; })) {
        // Our ticket is back after an outage (the server restarted with its data from an AOF
        // or RDB): keep its place, and renew it at once. Left alone, it would stay in the queue
        // ahead of everyone, given the free GPUs by every plan, until it expired silently.
        ticket.id = wanted.id;
        next_heartbeat = Clock::now();
        if (!waker) waker = RedisConnection::connect(settings_.endpoint, calls.connect_budget());
      }

      // 1. Which GPUs could serve it at all.
      for (const auto& host : hosts)
        if (std::none_of(snap.hosts.begin(), snap.hosts.end(),
                         [&](const HostEntry& h) { return h.name == host; }))
          throw Error(
              ErrorCode::kUnsatisfiable,
              fmt::format("no host '{}' in pool '{}' (hosts: {})", sanitize_for_display(host, 64),
                          settings_.pool, join_names(host_names(*connection))));
      const std::vector<const Gpu*> pool = request_gpus(snap.gpus, scope, request);
      std::vector<const Gpu*> candidates;
      std::vector<std::string> never_reasons;
      for (const Gpu* g : pool) {
        std::string never = never_reason(g->device, request, config_);
        if (never.empty() && g->local) never = outside_visible_reason(g->device, request);
        if (never.empty() && !g->unusable_reason().empty())
          never = fmt::format("{} of host {}: {}", describe_device(g->device), g->host,
                              g->unusable_reason());
        if (!never.empty()) {
          if (!request.gpus.empty()) throw Error(ErrorCode::kUnsatisfiable, never);
          never_reasons.push_back(never);
          continue;
        }
        candidates.push_back(g);
      }
      // A multi-GPU request is served from one host: the one with the most GPUs free for it now
      // (this host on a tie), chosen once.
      if (needed > 1 && request.gpus.empty() && !one_host) {
        if (chosen_host.empty()) {
          std::map<std::string, std::pair<std::size_t, std::size_t>> per_host;  // free, all
          for (const Gpu* g : candidates) {
            auto& [free, all] = per_host[g->host];
            ++all;
            if (g->lock.empty() && unready_reason(g->device, request).empty()) ++free;
          }
          std::pair<std::size_t, int> best{0, -1};
          for (const auto& [host, counts] : per_host) {
            if (counts.second < needed) continue;
            const std::pair<std::size_t, int> score{counts.first, host == settings_.host ? 1 : 0};
            if (chosen_host.empty() || score > best) {
              best = score;
              chosen_host = host;
            }
          }
        }
        std::erase_if(candidates, [&](const Gpu* g) { return g->host != chosen_host; });
      }
      if (candidates.size() < needed) {
        throw unsatisfiable(
            fmt::format("{} GPU{} requested but {} {} {} that can serve it{}", needed,
                        needed == 1 ? "" : "s", where, one_host ? "has" : "have", candidates.size(),
                        needed > 1 && !one_host ? " on one host" : ""),
            never_reasons);
      }
      wanted.candidates.clear();
      for (const Gpu* g : candidates) wanted.candidates.push_back(g->device.uuid);

      // 2. Plan the pool's queue; take our GPUs if it says so.
      QueueSnapshot q = plan(snap, ticket.id.empty() ? &wanted : nullptr);
      std::size_t me = 0;
      while (me < q.tickets.size() && q.tickets[me].id != wanted.id) ++me;
      if (me == q.tickets.size()) {
        // Our ticket expired (this process was stopped longer than its TTL): register again.
        ticket.id.clear();
        continue;
      }
      // Waiters on other hosts judge this host's GPUs by its registered readings: those of the
      // last gpulock process here to register (a waiter registers when it starts, not while it
      // waits). Where they would judge a ticket's health otherwise than the live readings this
      // plan used, plans disagree: each may leave a free GPU to a request the other thinks it
      // cannot serve, for as long as the registration stays old. Register the live readings,
      // before waking anyone, so that those woken plan as this one did.
      if (Clock::now() >= next_readings_push && registration_misleads(snap, q)) {
        register_readings(*connection, local_devices, /*force=*/true);  // those this plan used
        next_readings_push = Clock::now() + options_.health_recheck_interval;
      }
      const Placement& mine = q.plan.of(me);
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
        connection->run(redis_scripts::kWake, {settings_.version_key()}, to_wake);
      if (mine.standing == QueueStanding::kNext) {
        std::vector<const Gpu*> chosen;
        for (const auto& uuid : mine.gpus)
          for (const Gpu* g : candidates)
            if (g->device.uuid == uuid) chosen.push_back(g);
        SentAcquire acquire;
        acquire.lease_id = make_lease_id();
        if (!chosen.empty()) acquire.gpu_host = chosen.front()->host;
        for (const Gpu* g : chosen)
          acquire.gpus.push_back(LeasedGpu{g->device.index, g->device.display_index(),
                                           g->device.uuid, g->device.name,
                                           g->device.is_mig_instance()});
        acquire.started_at = std::chrono::system_clock::now();
        acquire.record = process_holder_record(acquire.lease_id, ::geteuid(), user, settings_.host,
                                               request, acquire.started_at);
        for (const Gpu* g : chosen) acquire.record.gpus.push_back(g->device.uuid);
        acquire.record_json = holder_record_json(acquire.record);
        acquire.args.lease_id = acquire.lease_id;
        acquire.args.ttl = settings_.lease_ttl;
        acquire.args.expected_version = snap.version;
        acquire.args.record_json = acquire.record_json;
        acquire.args.user = user;
        acquire.args.gpu_host = acquire.gpu_host;
        acquire.args.ticket_id = wanted.id;  // our ticket, if the queue has it
        acquire.args.limited = limited;
        acquire.args.to_wake = to_wake;
        acquire.args.gpus = acquire.record.gpus;
        acquire.sent = Clock::now();
        if (std::optional<Lease> lease = take(acquire)) return std::move(*lease);
        continue;  // the pool changed since the snapshot: plan again
      }

      if (!ticket.id.empty() && mine.may_enter) {
        // Room in the queue now: join it at the back.
        connection->run(redis_scripts::kLeave, {settings_.version_key()}, {ticket.id});
        ticket.id.clear();
        wanted.entered_over_limit = false;
        wanted.id = make_lease_id();
        continue;
      }

      if (request.wait && ticket.id.empty()) {
        std::size_t waiting_now = 0;
        for (const Ticket& t : snap.tickets)
          if (t.user == user && !t.entered_over_limit) ++waiting_now;
        wanted.entered_over_limit = waits_over_limit(waiting_now, user, config_);
        // A wake pushed to the ticket's list stays there until read: none is missed.
        if (!waker) waker = RedisConnection::connect(settings_.endpoint, calls.connect_budget());
        // The hosts it may be served from, so that snapshots read their GPUs ("" = any).
        std::string ticket_hosts;
        if (!any_host)
          for (const auto& host : hosts) ticket_hosts += host + "\n";
        // Waiting from now on, even if the answer is lost: the server may have run the entry
        // and then died or restarted before answering. An outage is then waited out like any
        // other, and the ticket, if it is back, keeps its place.
        has_waited = true;
        // Last in the plan, served and reserving nothing, with no limit in play: the entry
        // changes no one's plan, and the script leaves the version as it is (if it still is the
        // snapshot's), so that a waiter's acquire planned at it is not refused as stale.
        const bool behind_everyone = mine.standing == QueueStanding::kWaiting &&
                                     mine.gpus.empty() && mine.held_back.empty() &&
                                     q.plan.position_of[me] + 1 == q.plan.order.size() &&
                                     !limited && !waiting_limited;
        const EnterArgs entry{wanted.id,  kTicketTtl,     serialize_ticket(wanted),
                              user,       ticket_hosts,   snap.version,
                              snap.frees, behind_everyone};
        const EnterReply entered = parse_enter_reply(
            connection->run(redis_scripts::kEnter, {settings_.version_key()}, entry.argv()));
        ticket.id = wanted.id;
        next_heartbeat = Clock::now() + kHeartbeat;
        // Nothing changed between the snapshot and the entry (the version had not moved): the
        // queue is the one just planned, with this request at its back, so that plan stands and
        // this request goes to sleep without reading the queue again. A user under a
        // max_waiting limit plans again: the plan above let the newcomer past the limit.
        // Others who entered so since the snapshot (last, without moving the version) are not
        // in the plan: the queue's length tells.
        const bool planned_queue_stands =
            entered.complete && entered.unchanged &&
            entered.queued == static_cast<long long>(snap.tickets.size()) + 1 && !waiting_limited;
        if (!planned_queue_stands) continue;
        // The plan saw the pool as it is after the entry, too.
        planned = PoolMoment{entered.version, parse_server_us(entered.server_us)};
      }

      // 3. Not served now: explain why, then sleep until something changes.
      const std::vector<BlockingGpu> blocking = q.blocking(me);
      if (request.enclosing_lease_id) {
        std::vector<std::string> own;
        for (const Gpu* g : candidates) {
          const int i = q.gpu_index(g->device.uuid);
          if (i >= 0 && q.locks[i].record &&
              q.locks[i].record->lease_id == *request.enclosing_lease_id)
            own.push_back(q.gpu_names[i]);
        }
        check_enclosing_lease(own, candidates.size(), needed, *request.enclosing_lease_id);
      }
      const std::string blocked_by = q.blocked_by(me, config_);
      const int position = static_cast<int>(q.plan.position_of[me]) + 1;
      Error refusal = not_served(q, me, request.wait, blocking, blocked_by);
      if (!request.wait || Clock::now() >= deadline) throw refusal;
      outage.left_waiting(std::move(refusal));
      if (hooks.on_progress) {
        const std::string signature = fmt::format("{}\n{}", position, blocked_by);
        if (signature != last_progress || hooks.progress_refresh) {
          last_progress = signature;
          hooks.on_progress(WaitProgress{Clock::now() - start, blocking, position,
                                         static_cast<int>(q.tickets.size()), mine.standing,
                                         blocked_by});
        }
      }

      // Releases and departures wake the waiters they may serve; an expiring lock wakes nobody, so
      // wake when
      // the first lock on our candidates ends. Readings that decide health are re-read as often
      // as the local backend does.
      auto sleep = q.health_dependent() ? options_.health_recheck_interval
                                        : options_.safety_recheck_interval;
      for (const Gpu* g : candidates)
        if (!g->lock.empty() && g->lock_ttl_ms >= 0)
          sleep = std::min(sleep, milliseconds(g->lock_ttl_ms) + kExpiryMargin);
      // Nor is a ticket's: a request ahead that the plan gives (or reserves) free GPUs we could
      // use takes them at once if its waiter lives, waking us; if it is gone (killed, or a ticket
      // of before a restart, back from an AOF or RDB), wake when its ticket ends.
      const std::size_t my_position = q.plan.position_of[me];
      for (std::size_t at = 0; at < my_position; ++at) {
        const Placement& ahead = q.plan.order[at];
        if (ahead.request >= snap.ticket_ttl_ms.size() || snap.ticket_ttl_ms[ahead.request] < 0)
          continue;
        const bool wants_ours =
            std::any_of(ahead.gpus.begin(), ahead.gpus.end(), [&](const auto& u) {
              return std::any_of(candidates.begin(), candidates.end(),
                                 [&](const Gpu* g) { return g->device.uuid == u; });
            });
        if (wants_ours)
          sleep = std::min(sleep, milliseconds(snap.ticket_ttl_ms[ahead.request]) + kExpiryMargin);
      }
      const auto wake_at = Clock::now() + sleep;
      while (true) {
        auto slice =
            std::chrono::ceil<milliseconds>(std::min(wake_at, next_heartbeat) - Clock::now());
        if (hooks.interrupted) slice = std::min(slice, hooks.interrupt_poll);
        if (hooks.progress_refresh) slice = std::min(slice, *hooks.progress_refresh);
        if (deadline != Clock::time_point::max())
          slice = std::min(
              slice, std::chrono::ceil<milliseconds>(deadline - Clock::now()) + milliseconds(1));
        slice = std::max(slice, milliseconds(0));
        const std::optional<std::string> wake =
            wait_for_wake(*waker, settings_.prefix() + "wake:" + ticket.id, slice);
        bool woke = wake && wake_is_news(*wake, planned);
        if (hooks.interrupted && hooks.interrupted())
          throw Error(ErrorCode::kInterrupted, "interrupted while waiting for GPUs");
        const auto now = Clock::now();
        if (now >= next_heartbeat) {
          const RedisValue renewed =
              connection->run(redis_scripts::kHeartbeat, {settings_.version_key()},
                              {ticket.id, std::to_string(kTicketTtl.count())});
          if (renewed.integer == 0) {
            ticket.id.clear();  // it expired: register again
            woke = true;
          }
          next_heartbeat = now + kHeartbeat;
        }
        if (woke || now >= wake_at || now >= deadline || hooks.progress_refresh) break;
      }
    } catch (const Error& error) {
      // Redis went away while this request waits in the queue: keep waiting, retrying every
      // second until the deadline (if its ticket is gone when Redis answers, it joins again at
      // the back; a ticket still there, or back from an AOF or RDB, keeps its place).
      // Before the request asked to join the queue or sent an acquire, an unreachable server
      // is an error (exit 69).
      if (error.code() != ErrorCode::kEnvironment || !(has_waited || unanswered) || token_unusable)
        throw;
      if (Clock::now() >= deadline) outage.fail_at_deadline(error, last_look && !unanswered);
      const bool refused = !connection.broken() && !(waker && waker->broken());
      waker.reset();
      ticket.id.clear();
      outage.wait_to_retry(error, deadline, refused);
      try {
        waker = RedisConnection::connect(settings_.endpoint,
                                         std::min(milliseconds(2000), calls.connect_budget()));
      } catch (const Error&) {
        // Still unreachable: the next round fails the same way and comes back here.
        waker.reset();
      }
    }
  }
}

}  // namespace gpulock
