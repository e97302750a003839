// LocalBackend::acquire(): taking GPUs (whole, or a share of their memory) all-or-nothing under
// the machine-wide acquire mutex, in the queue's order, and waiting without polling.
#include "local/local_backend.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <span>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "backend/lease_state.h"
#include "backend/process_holder_record.h"
#include "backend/queue_request.h"
#include "backend/request_checks.h"
#include "gpulock/error.hpp"
#include "gpulock/parse.hpp"
#include "local/dispatcher_role.h"
#include "local/fork_guard.h"
#include "local/gpu_lock_file.h"
#include "local/local_lease_keeper.h"
#include "local/shared_leases.h"
#include "process/process_identity.h"
#include "queue/selection.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kDispatchers = DispatcherRole::kDispatchers;

}  // namespace

std::optional<Lease> LocalBackend::try_lock(const std::vector<const Device*>& chosen,
                                            const LeaseRequest& request, uid_t uid,
                                            bool& replaced) {
  auto lease = std::make_unique<LeaseState>();
  std::vector<UniqueFd> fds;
  std::vector<nlink_t> links;
  replaced = false;
  for (const Device* d : chosen) {
    struct stat opened {};
    UniqueFd fd = dir_.open_lock_file(d->uuid, &opened);
    if (!try_lock_exclusive(fd.get())) return std::nullopt;  // held outside gpulock's protocol
    const std::optional<nlink_t> current = dir_.links_if_current(opened, d->uuid);
    if (!current) {
      // Deleted or replaced between our open and our lock: the lock guards nothing.
      replaced = true;
      return std::nullopt;
    }
    fds.push_back(std::move(fd));
    links.push_back(*current);
    lease->gpus.push_back(
        LeasedGpu{d->index, d->display_index(), d->uuid, d->name, d->is_mig_instance()});
  }
  lease->keeper = std::make_unique<LocalLeaseKeeper>(std::move(fds), std::move(links));
  lease->id = make_lease_id();
  lease->started_at = std::chrono::system_clock::now();
  HolderRecord& record = lease->record;
  record =
      process_holder_record(lease->id, uid, user_of(uid), host_name(), request, lease->started_at);
  for (const auto& gpu : lease->gpus) record.gpus.push_back(gpu.uuid);
  lease->keeper->publish_record(record);
  return Lease(std::move(lease));
}

Lease LocalBackend::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  // A shared lease (a share of each GPU's memory) waits in the same queue, by memory.
  const bool shared = request.memory_bytes || request.slots;
  if (shared) check_shared_request(request);
  validate_request(request);
  const auto start = Clock::now();
  const Clock::time_point deadline = wait_deadline(request, start);
  const std::size_t needed = request.gpus.empty() ? request.count : request.gpus.size();
  const uid_t uid = ::geteuid();  // asked once: this process's
  const std::string& user = user_of(uid);
  check_gpu_limit(needed, user, config_);
  // Whether the config sets this limit for anyone.
  const auto any_limit = [this](std::optional<unsigned> UserLimits::*limit) {
    if (config_.default_limits.*limit) return true;
    for (const auto& [name, user_limits] : config_.per_user)
      if (user_limits.*limit) return true;
    return false;
  };
  const bool any_gpu_limit = any_limit(&UserLimits::max_gpus);

  // A departure can make room for a request held back by max_waiting even when no GPU is free.
  const bool waiting_limits = any_limit(&UserLimits::max_waiting);
  // True when no GPU of the machine is free: nobody can be served, no reservation changes.
  const auto every_gpu_held = [this](const std::vector<Device>& devices) {
    for (const auto& d : devices) {
      const LockState p = probe(d.uuid, false);
      if (!p.locked && p.error.empty()) return false;
    }
    return true;
  };

  // This request as the queue sees it; made when first planned (the fast path needs none),
  // registered only if it has to wait.
  Ticket wanted;

  // Made when the request joins the queue; its inotify instance, if it became a dispatcher, is
  // given back when it leaves (wait_channel.h).
  std::optional<WaitChannel> channel;
  OwnTicket ticket;
  QuickRechecks quick_rechecks;  // after a wake-up
  // The waiters that follow releases (the oldest kDispatchers), as this waiter last saw them.
  // Whoever sees a waiter join that pair wakes it, since nothing else tells it of its new role.
  std::vector<std::string> seen_dispatchers;
  // Wake-ups decided under the acquire mutex, sent once it is released: a waiter woken while
  // the mutex is held would find it taken and poll for it, and on a busy machine the woken
  // process can take the CPU from the mutex's holder. Declared before the hold, so that the
  // hold ends first (also when an exception leaves the block).
  struct WakesAfterRelease {
    LocalBackend& pool;
    std::vector<std::pair<std::string, WakeReason>> pending;
    void add(std::string id, WakeReason reason = WakeReason::kPlan) {
      pending.emplace_back(std::move(id), reason);
    }
    // Also while an exception leaves the block (one from opening the queue directory, say):
    // nothing may escape, and with nothing to send nothing is opened.
    ~WakesAfterRelease() {
      if (pending.empty()) return;
      try {
        QueueDirectory* queue = pool.queue_dir(false);
        if (!queue) return;
        for (const auto& [id, reason] : pending) queue->wake(id, reason);
      } catch (...) {
        // Best effort, like every wake-up: the dispatchers hear releases and departures anyway.
      }
    }
  };
  const auto tell_new_dispatchers = [&](std::span<const IndexEntry> live, bool leaving,
                                        WakesAfterRelease& wakes) {
    std::vector<std::string> now;
    for (const IndexEntry& t : live) {
      if (now.size() == kDispatchers) break;
      if (!(leaving && t.id == wanted.id)) now.push_back(t.id);
    }
    for (const auto& id : now)
      if (id != wanted.id &&
          std::find(seen_dispatchers.begin(), seen_dispatchers.end(), id) == seen_dispatchers.end())
        wakes.add(id, WakeReason::kDispatcher);
    seen_dispatchers = std::move(now);
  };
  std::string last_progress;
  // The ring: the waiter this one watches, and one found ended, whose slot goes at the next plan.
  std::optional<IndexEntry> watching;
  std::optional<IndexEntry> watched_gone;
  DispatcherRole role(start);
  // A waiter that leaves the queue alive wakes the one after it, which watched its process and
  // must now watch the one before it (whoever leaves dead, the pidfd tells).
  struct WakeSuccessorOnExit {
    LocalBackend& pool;
    OwnTicket& ticket;
    ~WakeSuccessorOnExit() {
      if (!ticket) return;
      if (QueueDirectory* queue = pool.queue_dir(false)) queue->wake_successor(ticket.ticket().seq);
    }
  } wake_successor_on_exit{*this, ticket};
  // The last plan, kept while a dispatcher looks again without planning (see skip_plan).
  QueueSnapshot snapshot;
  std::size_t me = 0;
  bool planned = false;
  bool shared_in_queue = false;  // the last plan had shared requests (a GPU in use may have room)
  // Waits for an event on the channel or the ticket's FIFO, at most `slice` and no longer than the
  // caller's interrupt poll; stops if the caller's interrupt asks.
  const auto wait_for_event = [&](std::chrono::milliseconds slice) {
    if (hooks.interrupted) slice = std::min(slice, hooks.interrupt_poll);
    const WaitChannel::Wakeup woke = channel->wait(ticket.wake_fd(), slice, hooks.interrupt_fd);
    if (hooks.interrupted && hooks.interrupted())
      throw Error(ErrorCode::kInterrupted, "interrupted while waiting for GPUs");
    return woke;
  };

  while (true) {
    const std::vector<Device> devices = source_->devices();

    // 1. Which devices could serve this request at all.
    std::vector<std::string> never_reasons;
    const std::vector<const Device*> candidates =
        shared ? shared_candidates(devices, request, never_reasons)
               : candidate_devices(devices, request, config_, never_reasons);
    if (candidates.size() < needed) {
      const std::string share = !shared ? ""
                                : request.memory_bytes
                                    ? " with " + format_size(*request.memory_bytes)
                                    : fmt::format(" with 1/{}", *request.slots);
      throw unsatisfiable(fmt::format("{} GPU{}{} requested but this machine has {} that can "
                                      "serve it",
                                      needed, needed == 1 ? "" : "s", share, candidates.size()),
                          never_reasons);
    }
    wanted.candidates.clear();
    for (const Device* d : candidates) wanted.candidates.push_back(d->uuid);

    // 2. Under the machine-wide acquire mutex: plan the queue; take our GPUs if it says so.
    // Unless this is a dispatcher woken by a release or a departure (or looking again shortly
    // after one, or after it began to watch) while every GPU is held: then nothing can have
    // changed who is served, the last plan stands, and a hand-off costs one plan however many
    // dispatchers hear of it. (The released lock may not be dropped yet when the event comes;
    // the quick re-checks look again.)
    // Made a dispatcher by a waiter that left: follow releases and departures from now on.
    if (role.start_round(static_cast<bool>(ticket), Clock::now()))
      channel->watch_releases(dir_.fd(), true);
    // (A GPU in shared use may still have room: with shared requests waiting, always plan.)
    const bool cheap = role.take_cheap_recheck();
    const bool skip_plan = cheap && planned && ticket && !waiting_limits && !shared_in_queue &&
                           every_gpu_held(devices);
    if (!skip_plan) {
      WakesAfterRelease wakes{*this, {}};
      AcquireMutex::Hold held = hold_acquire_mutex(deadline, start, hooks);

      // The ring watcher learnt that the waiter before it ended: its slot goes now.
      if (watched_gone) {
        if (QueueDirectory* queue = queue_dir(false)) queue->remove_dead(*watched_gone);
        watched_gone.reset();
      }
      // The oldest waiter's safety re-check also clears what dead waiters left behind.
      if (role.sweep_due(Clock::now(), options_.safety_recheck_interval)) {
        sweep_queue();
        role.swept(Clock::now());
      }
      QueueDirectory::Listing listing = list_queue_index();
      // Holder records are read only when someone's share or limit depends on them.
      const bool others_wait = listing.index.size() > (ticket ? 1u : 0u);

      // The common case, one GPU of any with nobody waiting and no limits: the first free
      // healthy candidate is the plan's choice (a request alone is offered the free GPUs in
      // candidate order, not the ones leased longest ago), so probe no further than that.
      if (shared && !others_wait) {
        // Nobody waits: the fitting GPUs, packed or spread, are the plan's choice.
        if (std::optional<Lease> lease = try_shared_now(candidates, request)) {
          ticket.leave();
          note_served(uid);
          return std::move(*lease);
        }
      } else if (!others_wait && !any_gpu_limit && request.gpus.empty() && needed == 1) {
        // Locking is the probe: a held GPU refuses the non-blocking lock, and we try the next.
        for (const Device* d : candidates) {
          if (!unready_reason(*d, request).empty()) continue;
          bool replaced = false;
          std::optional<Lease> lease;
          try {
            lease = try_lock({d}, request, uid, replaced);
          } catch (const Error&) {
            break;  // an unusable lock file (a planted symlink, ...): the plan below explains it
          }
          if (lease) {
            ticket.leave();
            note_served(uid);
            return std::move(*lease);
          }
          if (replaced) break;
        }
      }
      if (wanted.id.empty()) {
        std::vector<std::string> chosen = std::move(wanted.candidates);
        wanted = ticket_for_request(request, needed, user);
        wanted.candidates = std::move(chosen);
        if (shared) {
          wanted.shared_units = request.memory_bytes
                                    ? static_cast<std::uint32_t>(units_for(*request.memory_bytes))
                                    : 0;
          wanted.shared_slots = request.slots.value_or(0);
          wanted.spread = request.spread;
          // Shared leases may share a GPU with processes outside gpulock: their memory counts.
          wanted.allow_foreign_processes = true;
        }
      }
      std::vector<IndexEntry> gone;
      snapshot = plan(devices, listing, ticket ? nullptr : &wanted,
                      ticket ? &ticket.ticket() : nullptr, others_wait || any_gpu_limit, &gone);
      if (!gone.empty()) {
        // Waiters that ended without leaving (killed): plan again without them. (A slot whose
        // ticket is live but does not match it is only skipped: removing it would not work,
        // and planning again would find it again.)
        bool removed = false;
        if (QueueDirectory* queue = queue_dir(false))
          for (const IndexEntry& entry : gone) removed |= queue->remove_dead(entry);
        if (removed) continue;
      }
      // The live waiters as listed, by arrival.
      const std::vector<IndexEntry>& live = listing.index;
      // Ours by id and, once registered, seq (a planted slot may carry our id).
      me = 0;
      while (me < snapshot.tickets.size() &&
             !(snapshot.tickets[me].id == wanted.id &&
               (!ticket || snapshot.tickets[me].seq == ticket.ticket().seq)))
        ++me;
      if (me == snapshot.tickets.size()) {
        // Our ticket vanished (someone root removed the queue): register again.
        ticket = OwnTicket();
        continue;
      }
      planned = true;
      shared_in_queue = wanted.shared() || std::any_of(live.begin(), live.end(), [](const auto& e) {
                          return e.shared_units > 0 || e.shared_slots > 0;
                        });

      // A lock file that cannot be used (a planted symlink, ...) rules its GPU out.
      std::size_t unusable = 0;
      for (const Device* d : candidates) {
        const int g = snapshot.gpu_index(d->uuid);
        if (g >= 0 && !snapshot.locks[g].error.empty()) {
          never_reasons.push_back(snapshot.locks[g].error);
          ++unusable;
        }
      }
      if (unusable > 0 && (!request.gpus.empty() || candidates.size() - unusable < needed))
        throw unsatisfiable("cannot serve this request", never_reasons);

      // Wake every other waiter the plan serves now (they take their GPUs themselves), and
      // those for which there is room in the queue now (they register again).
      for (const Placement& placement : snapshot.plan.order)
        if ((placement.standing == QueueStanding::kNext || placement.may_enter) &&
            placement.request != me)
          wakes.add(snapshot.tickets[placement.request].id);
      for (const TicketId& id : snapshot.may_enter_beyond_head) wakes.add(id);

      const Placement& mine = snapshot.plan.of(me);
      if (mine.standing == QueueStanding::kNext) {
        std::vector<const Device*> chosen;
        for (const auto& uuid : mine.gpus)
          for (const Device* d : candidates)
            if (d->uuid == uuid) chosen.push_back(d);
        bool replaced = false;
        std::optional<Lease> lease;
        if (shared) {
          lease = try_lock_shared(
              chosen.size(),
              [&](std::size_t i) {
                const int g = snapshot.gpu_index(chosen[i]->uuid);
                return std::make_pair(chosen[i], static_cast<off_t>(snapshot.gpus[g].total_units));
              },
              request);
        } else {
          lease = try_lock(chosen, request, uid, replaced);
        }
        if (lease) {
          if (ticket) {
            tell_new_dispatchers(live, /*leaving=*/true, wakes);
            // The waiter after us watched our process; a dispatcher hears our departure anyway
            // (and re-wires when our process ends), others must be told.
            std::size_t k = 0;
            while (k < live.size() && live[k].id != wanted.id) ++k;
            if (k >= kDispatchers) {
              if (auto next = QueueDirectory::successor(ticket.ticket().seq, listing))
                wakes.add(std::move(*next));
            } else if (k == 0 && live.size() > 1) {
              // The oldest waiter leaves: the next one takes its part at once. Until it plans
              // it is a backup, which acts on a release only after backup_dispatcher_delay, and
              // with several GPUs the releases meanwhile waited that long (the 4-GPU drain's tail).
              wakes.add(live[1].id, WakeReason::kOldest);
            }
          }
          ticket.leave();
          note_served(uid);
          return std::move(*lease);
        }
        if (replaced) continue;  // try again at once, with the file now under that name
      }

      if (ticket && mine.may_enter) {
        // There is room for us in the queue now: join it at the back.
        if (auto next = QueueDirectory::successor(ticket.ticket().seq, listing))
          wakes.add(std::move(*next));
        ticket.leave();
        wanted.entered_over_limit = false;
        QueueDirectory& queue = *queue_dir(true);
        ticket = queue.enter(wanted, queue.list_index());
        wanted.seq = ticket.ticket().seq;
        continue;
      }

      if (request.wait && !ticket) {
        // Over the waiting limit, the request still waits, outside the queue's order, and
        // joins it when there is room; with a limit of 0 it could never join.
        const auto waiting_now = std::count_if(live.begin(), live.end(), [&](const IndexEntry& t) {
          return t.uid == wanted.uid && !t.entered_over_limit;
        });
        const bool over_limit =
            waits_over_limit(static_cast<std::size_t>(waiting_now), user, config_);
        // Register, and set up our watches below from this plan, which placed us as if we had
        // registered already (held back by the waiting limit, we plan again to learn our place).
        wanted.entered_over_limit = over_limit;
        if (!channel) channel.emplace();
        QueueDirectory& queue = *queue_dir(true);
        // Listed again if the queue directory was only made now (the listing was empty).
        ticket = queue.enter(wanted, listing.index.empty() ? queue.list_index() : listing);
        wanted.seq = ticket.ticket().seq;
        // The dispatchers as they are now: our own arrival is no news to them.
        seen_dispatchers.clear();
        for (std::size_t i = 0; i < live.size() && i < kDispatchers; ++i)
          seen_dispatchers.push_back(live[i].id);
        if (over_limit) continue;
      }

      if (ticket) {
        // Our part in the ring of waiters (see wait_channel.h): what follows changes nothing
        // that others plan from, so it need not keep them waiting for the mutex.
        held.release();
        QueueDirectory& queue = *queue_dir(true);
        std::size_t k = 0;
        while (k < live.size() && live[k].id != wanted.id) ++k;
        tell_new_dispatchers(live, /*leaving=*/false, wakes);
        // The three oldest waiters follow releases and departures, so that stopped waiters
        // (Ctrl-Z stops a script's whole process group) cannot hold up everyone's hand-offs
        // unless three are stopped; the others sleep until someone wakes them.
        role.place(k, Clock::now());
        // Having just started to watch, look at the locks again: a release between our look
        // and the watch would otherwise go unnoticed.
        if (channel->watch_releases(dir_.fd(), role.dispatches())) {
          role.recheck_cheaply();
          continue;
        }
        // The ring: each waiter watches the one before it. (The oldest is a dispatcher, which
        // hears every departure anyway, so the ring is not closed: arrivals need not wake it.)
        const std::size_t watched = k > 0 ? k - 1 : live.size();
        if (watched < live.size() && watched < listing.index.size()) {
          // Watch first, then check it still waits, so that its ending is never missed (and a
          // reused pid is never mistaken for it).
          const bool watchable =
              channel->watch_process(ProcessId{live[watched].pid, live[watched].pid_start});
          if (!queue.is_live(live[watched].id)) {
            watched_gone = listing.index[watched];  // cleared at once, then planned again
            continue;
          }
          // Live, but its process is not ours to see (another pid namespace, or a ticket kept
          // by a forked child): the dispatchers hear its departure instead.
          if (watchable) {
            watching = listing.index[watched];
          } else {
            channel->watch_process(ProcessId{});
            watching.reset();
          }
        } else {
          channel->watch_process(ProcessId{});
          watching.reset();
        }
      }
    }

    // 3. Not served now: explain why, then sleep until our turn may have come.
    for (std::size_t g = 0; g < snapshot.gpus.size(); ++g) {
      // Records are skipped while planning when nobody's share depends on them; people want
      // to know who holds what.
      LockState& p = snapshot.locks[g];
      if (p.locked && !p.record && p.error.empty()) p = probe(snapshot.gpus[g].uuid, true);
    }
    const std::vector<BlockingGpu> blocking = snapshot.blocking(me);
    if (request.enclosing_lease_id) {
      std::vector<std::string> own;
      for (const Device* d : candidates) {
        const int g = snapshot.gpu_index(d->uuid);
        if (g < 0) continue;
        const auto& record = snapshot.locks[g].record;
        if (record && record->lease_id == *request.enclosing_lease_id)
          own.push_back(d->display_index());
      }
      check_enclosing_lease(own, candidates.size(), needed, *request.enclosing_lease_id);
    }
    const Placement& mine = snapshot.plan.of(me);
    const std::string blocked_by = snapshot.blocked_by(me, config_);
    const int position = static_cast<int>(snapshot.position(me)) + 1;
    if (!request.wait || Clock::now() >= deadline)
      throw not_served(snapshot, me, request.wait, blocking, blocked_by);
    if (hooks.on_progress) {
      const std::string signature = fmt::format("{}\n{}", position, blocked_by);
      if (signature != last_progress || hooks.progress_refresh) {
        last_progress = signature;
        hooks.on_progress(WaitProgress{Clock::now() - start, blocking, position,
                                       static_cast<int>(snapshot.length()), mine.standing,
                                       blocked_by});
      }
    }

    // Only the dispatchers follow releases and GPU health; the others sleep until woken. Their
    // safety re-check is rare, so that a thousand idle waiters cost no CPU.
    // Memory used outside gpulock changes without an event: while shared requests wait, the
    // dispatchers (and only they) look again as often as for health.
    auto sleep = !role.dispatches() ? options_.safety_recheck_interval * 60
                 : snapshot.health_dependent() || shared_in_queue
                     ? options_.health_recheck_interval
                     : options_.safety_recheck_interval;
    // A waiter that sleeps until woken keeps no plan: its copy of the queue (each ticket ahead
    // of it) would make the memory of N waiters grow as N squared. What the plan's reading left
    // on the heap goes back to the kernel too; the next wake plans anew.
    if (!role.dispatches()) {
      snapshot = QueueSnapshot{};
      planned = false;
      ::malloc_trim(0);
    }
    const std::optional<std::chrono::milliseconds> pause = quick_rechecks.take();
    const bool quick = pause.has_value();
    if (pause) sleep = std::min(sleep, *pause);
    const auto wake_at = Clock::now() + sleep;
    bool event = false;      // a release or a departure
    bool must_plan = false;  // woken through the FIFO, or the watched waiter ended
    while (true) {
      // Rounded up: rounding down would make the last millisecond of every sleep a busy loop.
      auto slice = std::chrono::ceil<std::chrono::milliseconds>(wake_at - Clock::now());
      if (hooks.progress_refresh) slice = std::min(slice, *hooks.progress_refresh);
      if (deadline != Clock::time_point::max()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        slice = std::min(slice, left + std::chrono::milliseconds(1));
      }
      slice = std::max(slice, std::chrono::milliseconds(0));
      const WaitChannel::Wakeup woke = wait_for_event(slice);
      // The kernel reports a close just before it drops the closed file's lock (a lease's,
      // or a dead waiter's ticket's): look again shortly after any wake-up.
      if (!woke.timed_out()) quick_rechecks.arm();
      event |= !woke.timed_out() && !woke.promoted;
      must_plan |= woke.woken || woke.watched_ended;
      role.hear_promotion(woke.promoted, woke.made_oldest);
      if (!woke.timed_out() && role.is_backup() && !role.made_oldest_pending() && !must_plan) {
        // The oldest waiter normally handles this at once; the others are its backups (for
        // when it is stopped) and give it, and the waiter it serves, the mutex first.
        // The whole delay, not until the next event: in a busy queue events come every few
        // milliseconds, and the backups would plan at each.
        // (PoolOptions::backup_dispatcher_delay: long enough for the oldest waiter, or the one
        // whose watched holder just ended, to plan and take its GPUs, so that the backups then
        // find every GPU held and need not plan at all.)
        // Never past the request's deadline, and checking the caller's interrupt as it asks. (A
        // progress line due meanwhile waits for the delay's end: it shows nothing new.)
        const auto until = std::min(deadline, Clock::now() + options_.backup_dispatcher_delay);
        for (auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
             !must_plan && !role.made_oldest_pending() && left.count() > 0;
             left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now())) {
          const WaitChannel::Wakeup later = wait_for_event(left);
          must_plan |= later.woken || later.watched_ended;
          role.hear_promotion(later.promoted, later.made_oldest);
        }
      }
      // The waiter this one watches ended (the pidfd fired, and the channel stopped watching).
      if (watching && !channel->watching_process()) {
        watched_gone = watching;
        watching.reset();
      }
      const auto now = Clock::now();
      if (!woke.timed_out() || now >= wake_at || now >= deadline || hooks.progress_refresh) break;
    }
    role.woke(must_plan, event || quick);
  }
}

}  // namespace gpulock
