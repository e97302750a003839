// LocalBackend::acquire() and its round (LocalBackend::Round, below run_acquire_loop()): taking
// GPUs (whole, or a share of their memory) all-or-nothing under the machine-wide acquire mutex,
// in the queue's order, and waiting without polling. The waiter's part in the queue's wake-up
// scheme (wait_channel.h) is its DispatcherRole, and its place in the ring of waiters.
#include "local/local_backend.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <span>

#include <fmt/format.h>

#include "backend/acquire_loop.h"
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

class LocalBackend::Round final : public AcquireRound {
 public:
  Round(LocalBackend& pool, const LeaseRequest& request, const WaitHooks& hooks,
        const AcquireWait& wait, uid_t uid, const std::string& user);
  // A waiter that leaves the queue alive wakes the one after it, which watched its process and
  // must now watch the one before it (whoever leaves dead, the pidfd tells). Then the ticket
  // leaves the queue.
  ~Round() override;

  RoundOutcome look() override;
  // Until an event may have changed the plan: a release or departure (dispatchers), a wake-up
  // through the FIFO, the watched waiter's end, or the time explain() chose.
  void sleep(Clock::time_point deadline) override;

 private:
  // Wake-ups decided under the acquire mutex, sent once it is released: a waiter woken while
  // the mutex is held would find it taken and poll for it, and on a busy machine the woken
  // process can take the CPU from the mutex's holder. Made before the hold, so that the hold
  // ends first, also when an exception leaves the round.
  class PendingWakes {
   public:
    explicit PendingWakes(LocalBackend& pool) : pool_(pool) {}
    PendingWakes(const PendingWakes&) = delete;
    PendingWakes& operator=(const PendingWakes&) = delete;
    ~PendingWakes();
    void add(std::string id, WakeReason reason = WakeReason::kPlan) {
      pending_.emplace_back(std::move(id), reason);
    }

   private:
    LocalBackend& pool_;
    std::vector<std::pair<std::string, WakeReason>> pending_;
  };

  // The devices that could ever serve the request; throws kUnsatisfiable when too few.
  void find_candidates();
  // Whether this round may keep the last plan: a dispatcher woken by a release or a departure
  // (or looking again shortly after one, or after it began to watch) while every GPU is held.
  bool may_keep_plan();
  // Under the acquire mutex: plans the queue, and takes our GPUs if it says so, enters or
  // rejoins the queue, or takes our place in the ring. nullopt: not served, explain() says why.
  std::optional<RoundOutcome> plan_and_take();
  // The common cases served without a plan: nobody waits and no limit is in play.
  std::optional<Lease> take_unplanned(bool others_wait);
  // Makes `wanted_` (its id, kind and share) when first planned.
  void make_wanted();
  // Finds our ticket in the plan; false when it vanished (the next round registers again).
  bool find_me();
  // Throws kUnsatisfiable where unusable lock files leave too few candidates.
  void check_usable_lock_files();
  // Takes the GPUs the plan gives us. nullopt if they were taken or replaced meanwhile
  // (`*replaced`: look again at once).
  std::optional<Lease> take_placement(const Placement& mine, const QueueDirectory::Listing& listing,
                                      PendingWakes& wakes, bool* replaced);
  // Registers in the queue (over the waiting limit: outside its order). Returns whether it
  // entered over the limit, and must plan again to learn its place.
  bool enter_queue(const QueueDirectory::Listing& listing);
  // After the mutex is released: this waiter's role and its place in the ring. Returns false
  // where the round must look again at once.
  bool take_place_in_ring(const QueueDirectory::Listing& listing, PendingWakes& wakes);
  // Tells waiters that became one of the dispatchers (the oldest kDispatchers) of their role.
  void tell_new_dispatchers(std::span<const IndexEntry> live, bool leaving, PendingWakes& wakes);
  // Why the request is not served, and (in sleep_for_) how long to sleep unwoken.
  NotServed explain();
  // Waits for an event on the channel or the ticket's FIFO, at most `slice`.
  WaitChannel::Wakeup wait_for_event(std::chrono::milliseconds slice);
  // True when no GPU of the machine is free: nobody can be served, no reservation changes.
  bool every_gpu_held() const;

  LocalBackend& pool_;
  const LeaseRequest& request_;
  const WaitHooks& hooks_;
  const AcquireWait& wait_;
  const bool shared_;  // a share of each GPU's memory, waiting in the same queue by memory
  const uid_t uid_;    // asked once: this process's
  const std::string& user_;
  const bool any_gpu_limit_;  // the config sets max_gpus for anyone
  // The config sets max_waiting for anyone: a departure can then make room for a request held
  // back even when no GPU is free.
  const bool waiting_limits_;

  std::vector<Device> devices_;             // this round's inventory
  std::vector<const Device*> candidates_;   // of devices_
  std::vector<std::string> never_reasons_;  // why the others cannot serve it
  // This request as the queue sees it; made when first planned (the fast path needs none),
  // registered only if it has to wait.
  Ticket wanted_;
  // Made when the request joins the queue; its inotify instance, if it became a dispatcher, is
  // given back when it leaves (wait_channel.h).
  std::optional<WaitChannel> channel_;
  OwnTicket ticket_;
  QuickRechecks quick_rechecks_;  // after a wake-up
  // The waiters that follow releases (the oldest kDispatchers), as this waiter last saw them.
  // Whoever sees a waiter join that group wakes it, since nothing else tells it of its new role.
  std::vector<std::string> seen_dispatchers_;
  // The ring: the waiter this one watches, and one found ended, whose slot goes at the next plan.
  std::optional<IndexEntry> watching_;
  std::optional<IndexEntry> watched_gone_;
  DispatcherRole role_;
  // The last plan, kept while a dispatcher looks again without planning (see may_keep_plan).
  QueueSnapshot snapshot_;
  std::size_t me_ = 0;
  bool planned_ = false;
  bool shared_in_queue_ = false;  // the last plan had shared requests (a GPU in use may have room)
  std::chrono::milliseconds sleep_for_{0};
};

Lease LocalBackend::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  if (request.memory_bytes || request.slots) check_shared_request(request);
  const uid_t uid = ::geteuid();
  const std::string& user = user_of(uid);
  const AcquireWait wait = start_acquire(request, user, config_);
  Round round(*this, request, hooks, wait, uid, user);
  return run_acquire_loop(round, request, hooks, wait);
}

namespace {

// Whether the config sets this limit for anyone.
bool any_limit(const Config& config, std::optional<unsigned> UserLimits::*limit) {
  if (config.default_limits.*limit) return true;
  for (const auto& [name, user_limits] : config.per_user)
    if (user_limits.*limit) return true;
  return false;
}

}  // namespace

LocalBackend::Round::Round(LocalBackend& pool, const LeaseRequest& request, const WaitHooks& hooks,
                           const AcquireWait& wait, uid_t uid, const std::string& user)
    : pool_(pool),
      request_(request),
      hooks_(hooks),
      wait_(wait),
      shared_(request.memory_bytes || request.slots),
      uid_(uid),
      user_(user),
      any_gpu_limit_(any_limit(pool.config_, &UserLimits::max_gpus)),
      waiting_limits_(any_limit(pool.config_, &UserLimits::max_waiting)),
      role_(wait.start) {}

LocalBackend::Round::~Round() {
  if (!ticket_) return;
  if (QueueDirectory* queue = pool_.queue_dir(false)) queue->wake_successor(ticket_.ticket().seq);
}

LocalBackend::Round::PendingWakes::~PendingWakes() {
  // Also while an exception leaves the round (one from opening the queue directory, say):
  // nothing may escape, and with nothing to send nothing is opened.
  if (pending_.empty()) return;
  try {
    QueueDirectory* queue = pool_.queue_dir(false);
    if (!queue) return;
    for (const auto& [id, reason] : pending_) queue->wake(id, reason);
  } catch (...) {
    // Best effort, like every wake-up: the dispatchers hear releases and departures anyway.
  }
}

void LocalBackend::Round::tell_new_dispatchers(std::span<const IndexEntry> live, bool leaving,
                                               PendingWakes& wakes) {
  std::vector<std::string> now;
  for (const IndexEntry& t : live) {
    if (now.size() == kDispatchers) break;
    if (!(leaving && t.id == wanted_.id)) now.push_back(t.id);
  }
  for (const auto& id : now)
    if (id != wanted_.id && std::find(seen_dispatchers_.begin(), seen_dispatchers_.end(), id) ==
                                seen_dispatchers_.end())
      wakes.add(id, WakeReason::kDispatcher);
  seen_dispatchers_ = std::move(now);
}

bool LocalBackend::Round::every_gpu_held() const {
  for (const auto& d : devices_) {
    const LockState p = pool_.probe(d.uuid, false);
    if (!p.locked && p.error.empty()) return false;
  }
  return true;
}

WaitChannel::Wakeup LocalBackend::Round::wait_for_event(std::chrono::milliseconds slice) {
  if (hooks_.interrupted) slice = std::min(slice, hooks_.interrupt_poll);
  const WaitChannel::Wakeup woke = channel_->wait(ticket_.wake_fd(), slice, hooks_.interrupt_fd);
  check_interrupted(hooks_, "interrupted while waiting for GPUs");
  return woke;
}

void LocalBackend::Round::find_candidates() {
  never_reasons_.clear();
  candidates_ = shared_ ? pool_.shared_candidates(devices_, request_, never_reasons_)
                        : candidate_devices(devices_, request_, pool_.config_, never_reasons_);
  const std::size_t needed = wait_.needed;
  if (candidates_.size() < needed) {
    const std::string share = !shared_ ? ""
                              : request_.memory_bytes
                                  ? " with " + format_size(*request_.memory_bytes)
                                  : fmt::format(" with 1/{}", *request_.slots);
    throw unsatisfiable(fmt::format("{} GPU{}{} requested but this machine has {} that can "
                                    "serve it",
                                    needed, needed == 1 ? "" : "s", share, candidates_.size()),
                        never_reasons_);
  }
  wanted_.candidates.clear();
  for (const Device* d : candidates_) wanted_.candidates.push_back(d->uuid);
}

bool LocalBackend::Round::may_keep_plan() {
  // Made a dispatcher by a waiter that left: follow releases and departures from now on.
  if (role_.start_round(static_cast<bool>(ticket_), Clock::now()))
    channel_->watch_releases(pool_.dir_.fd(), true);
  // Nothing can have changed who is served, so a hand-off costs one plan however many
  // dispatchers hear of it. (The released lock may not be dropped yet when the event comes;
  // the quick re-checks look again.) A GPU in shared use may still have room: with shared
  // requests waiting, always plan.
  const bool cheap = role_.take_cheap_recheck();
  return cheap && planned_ && ticket_ && !waiting_limits_ && !shared_in_queue_ && every_gpu_held();
}

RoundOutcome LocalBackend::Round::look() {
  devices_ = pool_.source_->devices();
  // 1. Which devices could serve this request at all.
  find_candidates();
  // 2. Plan the queue under the machine-wide acquire mutex; take our GPUs if it says so.
  if (!may_keep_plan())
    if (std::optional<RoundOutcome> outcome = plan_and_take()) return std::move(*outcome);
  // 3. Not served now: explain why; the loop sleeps until our turn may have come.
  return RoundOutcome::waits(explain());
}

std::optional<Lease> LocalBackend::Round::take_unplanned(bool others_wait) {
  if (shared_ && !others_wait) {
    // Nobody waits: the fitting GPUs, packed or spread, are the plan's choice.
    return pool_.try_shared_now(candidates_, request_);
  }
  // The common case, one GPU of any with nobody waiting and no limits: the first free healthy
  // candidate is the plan's choice (a request alone is offered the free GPUs in candidate
  // order, not the ones leased longest ago), so probe no further than that.
  if (others_wait || any_gpu_limit_ || !request_.gpus.empty() || wait_.needed != 1)
    return std::nullopt;
  // Locking is the probe: a held GPU refuses the non-blocking lock, and we try the next.
  for (const Device* d : candidates_) {
    if (!unready_reason(*d, request_).empty()) continue;
    bool replaced = false;
    std::optional<Lease> lease;
    try {
      lease = pool_.try_lock({d}, request_, uid_, replaced);
    } catch (const Error&) {
      break;  // an unusable lock file (a planted symlink, ...): the plan explains it
    }
    if (lease || replaced) return lease;
  }
  return std::nullopt;
}

void LocalBackend::Round::make_wanted() {
  if (!wanted_.id.empty()) return;
  std::vector<std::string> chosen = std::move(wanted_.candidates);
  wanted_ = ticket_for_request(request_, wait_.needed, user_);
  wanted_.candidates = std::move(chosen);
  if (shared_) {
    wanted_.shared_units =
        request_.memory_bytes ? static_cast<std::uint32_t>(units_for(*request_.memory_bytes)) : 0;
    wanted_.shared_slots = request_.slots.value_or(0);
    wanted_.spread = request_.spread;
    // Shared leases may share a GPU with processes outside gpulock: their memory counts.
    wanted_.allow_foreign_processes = true;
  }
}

bool LocalBackend::Round::find_me() {
  // Ours by id and, once registered, seq (a planted slot may carry our id).
  me_ = 0;
  while (me_ < snapshot_.tickets.size() &&
         !(snapshot_.tickets[me_].id == wanted_.id &&
           (!ticket_ || snapshot_.tickets[me_].seq == ticket_.ticket().seq)))
    ++me_;
  if (me_ < snapshot_.tickets.size()) return true;
  // Our ticket vanished (someone root removed the queue): register again.
  ticket_ = OwnTicket();
  return false;
}

void LocalBackend::Round::check_usable_lock_files() {
  // A lock file that cannot be used (a planted symlink, ...) rules its GPU out.
  std::size_t unusable = 0;
  for (const Device* d : candidates_) {
    const int g = snapshot_.gpu_index(d->uuid);
    if (g >= 0 && !snapshot_.locks[g].error.empty()) {
      never_reasons_.push_back(snapshot_.locks[g].error);
      ++unusable;
    }
  }
  if (unusable > 0 && (!request_.gpus.empty() || candidates_.size() - unusable < wait_.needed))
    throw unsatisfiable("cannot serve this request", never_reasons_);
}

std::optional<Lease> LocalBackend::Round::take_placement(const Placement& mine,
                                                         const QueueDirectory::Listing& listing,
                                                         PendingWakes& wakes, bool* replaced) {
  std::vector<const Device*> chosen;
  for (const auto& uuid : mine.gpus)
    for (const Device* d : candidates_)
      if (d->uuid == uuid) chosen.push_back(d);
  std::optional<Lease> lease;
  if (shared_) {
    lease = pool_.try_lock_shared(
        chosen.size(),
        [&](std::size_t i) {
          const int g = snapshot_.gpu_index(chosen[i]->uuid);
          return std::make_pair(chosen[i], static_cast<off_t>(snapshot_.gpus[g].total_units));
        },
        request_);
  } else {
    lease = pool_.try_lock(chosen, request_, uid_, *replaced);
  }
  if (!lease || !ticket_) return lease;
  const std::vector<IndexEntry>& live = listing.index;
  tell_new_dispatchers(live, /*leaving=*/true, wakes);
  // The waiter after us watched our process; a dispatcher hears our departure anyway (and
  // re-wires when our process ends), others must be told.
  std::size_t k = 0;
  while (k < live.size() && live[k].id != wanted_.id) ++k;
  if (k >= kDispatchers) {
    if (auto next = QueueDirectory::successor(ticket_.ticket().seq, listing))
      wakes.add(std::move(*next));
  } else if (k == 0 && live.size() > 1) {
    // The oldest waiter leaves: the next one takes its part at once. Until it plans it is a
    // backup, which acts on a release only after backup_dispatcher_delay, and with several
    // GPUs the releases meanwhile waited that long (the 4-GPU drain's tail).
    wakes.add(live[1].id, WakeReason::kOldest);
  }
  return lease;
}

bool LocalBackend::Round::enter_queue(const QueueDirectory::Listing& listing) {
  const std::vector<IndexEntry>& live = listing.index;
  // Over the waiting limit, the request still waits, outside the queue's order, and joins it
  // when there is room; with a limit of 0 it could never join.
  const auto waiting_now = std::count_if(live.begin(), live.end(), [&](const IndexEntry& t) {
    return t.uid == wanted_.uid && !t.entered_over_limit;
  });
  const bool over_limit =
      waits_over_limit(static_cast<std::size_t>(waiting_now), user_, pool_.config_);
  // Register, and set up our watches from this plan, which placed us as if we had registered
  // already (held back by the waiting limit, we plan again to learn our place).
  wanted_.entered_over_limit = over_limit;
  if (!channel_) channel_.emplace();
  QueueDirectory& queue = *pool_.queue_dir(true);
  // Listed again if the queue directory was only made now (the listing was empty).
  ticket_ = queue.enter(wanted_, listing.index.empty() ? queue.list_index() : listing);
  wanted_.seq = ticket_.ticket().seq;
  // The dispatchers as they are now: our own arrival is no news to them.
  seen_dispatchers_.clear();
  for (std::size_t i = 0; i < live.size() && i < kDispatchers; ++i)
    seen_dispatchers_.push_back(live[i].id);
  return over_limit;
}

bool LocalBackend::Round::take_place_in_ring(const QueueDirectory::Listing& listing,
                                             PendingWakes& wakes) {
  const std::vector<IndexEntry>& live = listing.index;
  QueueDirectory& queue = *pool_.queue_dir(true);
  std::size_t k = 0;
  while (k < live.size() && live[k].id != wanted_.id) ++k;
  tell_new_dispatchers(live, /*leaving=*/false, wakes);
  // The three oldest waiters follow releases and departures, so that stopped waiters (Ctrl-Z
  // stops a script's whole process group) cannot hold up everyone's hand-offs unless three are
  // stopped; the others sleep until someone wakes them.
  role_.place(k, Clock::now());
  // Having just started to watch, look at the locks again: a release between our look and the
  // watch would otherwise go unnoticed.
  if (channel_->watch_releases(pool_.dir_.fd(), role_.dispatches())) {
    role_.recheck_cheaply();
    return false;
  }
  // The ring: each waiter watches the one before it. (The oldest is a dispatcher, which hears
  // every departure anyway, so the ring is not closed: arrivals need not wake it.)
  const std::size_t watched = k > 0 ? k - 1 : live.size();
  if (watched >= live.size()) {
    channel_->watch_process(ProcessId{});
    watching_.reset();
    return true;
  }
  // Watch first, then check it still waits, so that its ending is never missed (and a reused
  // pid is never mistaken for it).
  const bool watchable =
      channel_->watch_process(ProcessId{live[watched].pid, live[watched].pid_start});
  if (!queue.is_live(live[watched].id)) {
    watched_gone_ = live[watched];  // cleared at once, then planned again
    return false;
  }
  // Live, but its process is not ours to see (another pid namespace, or a ticket kept by a
  // forked child): the dispatchers hear its departure instead.
  if (watchable) {
    watching_ = live[watched];
  } else {
    channel_->watch_process(ProcessId{});
    watching_.reset();
  }
  return true;
}

std::optional<RoundOutcome> LocalBackend::Round::plan_and_take() {
  PendingWakes wakes(pool_);
  AcquireMutex::Hold held = pool_.hold_acquire_mutex(wait_.deadline, wait_.start, hooks_);

  // The ring watcher learnt that the waiter before it ended: its slot goes now.
  if (watched_gone_) {
    if (QueueDirectory* queue = pool_.queue_dir(false)) queue->remove_dead(*watched_gone_);
    watched_gone_.reset();
  }
  // The oldest waiter's safety re-check also clears what dead waiters left behind.
  if (role_.sweep_due(Clock::now(), pool_.options_.safety_recheck_interval)) {
    pool_.sweep_queue();
    role_.swept(Clock::now());
  }
  QueueDirectory::Listing listing = pool_.list_queue_index();
  // Holder records are read only when someone's share or limit depends on them.
  const bool others_wait = listing.index.size() > (ticket_ ? 1u : 0u);
  if (std::optional<Lease> lease = take_unplanned(others_wait)) {
    ticket_.leave();
    pool_.note_served(uid_);
    return RoundOutcome::served(std::move(*lease));
  }
  make_wanted();
  std::vector<IndexEntry> gone;
  snapshot_ =
      pool_.plan(devices_, listing, ticket_ ? nullptr : &wanted_,
                 ticket_ ? &ticket_.ticket() : nullptr, others_wait || any_gpu_limit_, &gone);
  if (!gone.empty()) {
    // Waiters that ended without leaving (killed): plan again without them. (A slot whose
    // ticket is live but does not match it is only skipped: removing it would not work, and
    // planning again would find it again.)
    bool removed = false;
    if (QueueDirectory* queue = pool_.queue_dir(false))
      for (const IndexEntry& entry : gone) removed |= queue->remove_dead(entry);
    if (removed) return RoundOutcome::look_again();
  }
  if (!find_me()) return RoundOutcome::look_again();
  planned_ = true;
  const std::vector<IndexEntry>& live = listing.index;  // the live waiters, by arrival
  shared_in_queue_ = wanted_.shared() || std::any_of(live.begin(), live.end(), [](const auto& e) {
                       return e.shared_units > 0 || e.shared_slots > 0;
                     });
  check_usable_lock_files();

  // Wake every other waiter the plan serves now (they take their GPUs themselves), and those
  // for which there is room in the queue now (they register again).
  for (const Placement& placement : snapshot_.plan.order)
    if ((placement.standing == QueueStanding::kNext || placement.may_enter) &&
        placement.request != me_)
      wakes.add(snapshot_.tickets[placement.request].id);
  for (const TicketId& id : snapshot_.may_enter_beyond_head) wakes.add(id);

  const Placement& mine = snapshot_.plan.of(me_);
  if (mine.standing == QueueStanding::kNext) {
    bool replaced = false;
    if (std::optional<Lease> lease = take_placement(mine, listing, wakes, &replaced)) {
      ticket_.leave();
      pool_.note_served(uid_);
      return RoundOutcome::served(std::move(*lease));
    }
    if (replaced) return RoundOutcome::look_again();  // at once, with the file now under that name
  }
  if (ticket_ && mine.may_enter) {
    // There is room for us in the queue now: join it at the back.
    if (auto next = QueueDirectory::successor(ticket_.ticket().seq, listing))
      wakes.add(std::move(*next));
    ticket_.leave();
    wanted_.entered_over_limit = false;
    QueueDirectory& queue = *pool_.queue_dir(true);
    ticket_ = queue.enter(wanted_, queue.list_index());
    wanted_.seq = ticket_.ticket().seq;
    return RoundOutcome::look_again();
  }
  if (request_.wait && !ticket_ && enter_queue(listing)) return RoundOutcome::look_again();
  if (ticket_) {
    // Our part in the ring changes nothing that others plan from: it need not keep them
    // waiting for the mutex.
    held.release();
    if (!take_place_in_ring(listing, wakes)) return RoundOutcome::look_again();
  }
  return std::nullopt;
}

NotServed LocalBackend::Round::explain() {
  for (std::size_t g = 0; g < snapshot_.gpus.size(); ++g) {
    // Records are skipped while planning when nobody's share depends on them; people want to
    // know who holds what.
    LockState& p = snapshot_.locks[g];
    if (p.locked && !p.record && p.error.empty()) p = pool_.probe(snapshot_.gpus[g].uuid, true);
  }
  std::vector<BlockingGpu> blocking = snapshot_.blocking(me_);
  if (request_.enclosing_lease_id) {
    std::vector<std::string> own;
    for (const Device* d : candidates_) {
      const int g = snapshot_.gpu_index(d->uuid);
      if (g < 0) continue;
      const auto& record = snapshot_.locks[g].record;
      if (record && record->lease_id == *request_.enclosing_lease_id)
        own.push_back(d->display_index());
    }
    check_enclosing_lease(own, candidates_.size(), wait_.needed, *request_.enclosing_lease_id);
  }
  const Placement& mine = snapshot_.plan.of(me_);
  std::string blocked_by = snapshot_.blocked_by(me_, pool_.config_);
  const int position = static_cast<int>(snapshot_.position(me_)) + 1;
  // Only the dispatchers follow releases and GPU health; the others sleep until woken. Their
  // safety re-check is rare, so that a thousand idle waiters cost no CPU. Memory used outside
  // gpulock changes without an event: while shared requests wait, the dispatchers (and only
  // they) look again as often as for health.
  const PoolOptions& options = pool_.options_;
  sleep_for_ = !role_.dispatches() ? options.safety_recheck_interval * 60
               : snapshot_.health_dependent() || shared_in_queue_ ? options.health_recheck_interval
                                                                  : options.safety_recheck_interval;
  Error refusal = not_served(snapshot_, me_, request_.wait, blocking, blocked_by);
  std::string signature = fmt::format("{}\n{}", position, blocked_by);
  WaitProgress progress{{},
                        std::move(blocking),
                        position,
                        static_cast<int>(snapshot_.length()),
                        mine.standing,
                        std::move(blocked_by)};
  return NotServed{std::move(refusal), std::move(progress), std::move(signature)};
}

void LocalBackend::Round::sleep(Clock::time_point deadline) {
  // A waiter that sleeps until woken keeps no plan: its copy of the queue (each ticket ahead of
  // it) would make the memory of N waiters grow as N squared. What the plan's reading left on
  // the heap goes back to the kernel too; the next wake plans anew.
  if (!role_.dispatches()) {
    snapshot_ = QueueSnapshot{};
    planned_ = false;
    ::malloc_trim(0);
  }
  auto sleep = sleep_for_;
  const std::optional<std::chrono::milliseconds> pause = quick_rechecks_.take();
  const bool quick = pause.has_value();
  if (pause) sleep = std::min(sleep, *pause);
  const auto wake_at = Clock::now() + sleep;
  bool event = false;      // a release or a departure
  bool must_plan = false;  // woken through the FIFO, or the watched waiter ended
  while (true) {
    const WaitChannel::Wakeup woke = wait_for_event(sleep_slice(wake_at, deadline, hooks_));
    // The kernel reports a close just before it drops the closed file's lock (a lease's, or a
    // dead waiter's ticket's): look again shortly after any wake-up.
    if (!woke.timed_out()) quick_rechecks_.arm();
    event |= !woke.timed_out() && !woke.promoted;
    must_plan |= woke.woken || woke.watched_ended;
    role_.hear_promotion(woke.promoted, woke.made_oldest);
    if (!woke.timed_out() && role_.is_backup() && !role_.made_oldest_pending() && !must_plan) {
      // The oldest waiter normally handles this at once; the others are its backups (for when
      // it is stopped) and give it, and the waiter it serves, the mutex first. The whole delay,
      // not until the next event: in a busy queue events come every few milliseconds, and the
      // backups would plan at each. (PoolOptions::backup_dispatcher_delay: long enough for the
      // oldest waiter, or the one whose watched holder just ended, to plan and take its GPUs,
      // so that the backups then find every GPU held and need not plan at all.) Never past the
      // request's deadline, and checking the caller's interrupt as it asks. (A progress line
      // due meanwhile waits for the delay's end: it shows nothing new.)
      const auto until = std::min(deadline, Clock::now() + pool_.options_.backup_dispatcher_delay);
      for (auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
           !must_plan && !role_.made_oldest_pending() && left.count() > 0;
           left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now())) {
        const WaitChannel::Wakeup later = wait_for_event(left);
        must_plan |= later.woken || later.watched_ended;
        role_.hear_promotion(later.promoted, later.made_oldest);
      }
    }
    // The waiter this one watches ended (the pidfd fired, and the channel stopped watching).
    if (watching_ && !channel_->watching_process()) {
      watched_gone_ = watching_;
      watching_.reset();
    }
    const auto now = Clock::now();
    if (!woke.timed_out() || now >= wake_at || now >= deadline || hooks_.progress_refresh) break;
  }
  role_.woke(must_plan, event || quick);
}

}  // namespace gpulock
