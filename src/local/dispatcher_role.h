// DispatcherRole and QuickRechecks: the part a waiting local request plays in the queue's
// wake-up scheme (wait_channel.h), as named states rather than a set of flags in the loop.
//
// The kDispatchers oldest waiters follow releases and departures; the others sleep until a
// waiter wakes them through their FIFO, or the waiter they watch in the ring ends:
//   kSleeper  not one of them: sleeps until woken, and keeps no plan meanwhile;
//   kBackup   the second or third oldest: acts on a release only after backup_dispatcher_delay,
//             so that the oldest (and the waiter it serves) take the acquire mutex first;
//   kOldest   acts at once, and its safety re-check also sweeps the queue of dead entries.
// A waiter that leaves may promote the next ones by a wake-up; the promotion takes effect at
// the start of the next round. After an event a dispatcher looks again cheaply: while every
// GPU is held, the last plan stands.
#pragma once

#include <chrono>
#include <cstddef>
#include <iterator>
#include <optional>

namespace gpulock {

class DispatcherRole {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Kind { kSleeper, kBackup, kOldest };

  // How many of the oldest waiters follow releases and departures: with three, a departure is
  // acted on even when two of them are stopped (Ctrl-Z stops a script's whole process group).
  static constexpr std::size_t kDispatchers = 3;

  explicit DispatcherRole(Clock::time_point start) : last_sweep_(start) {}

  Kind kind() const { return kind_; }
  bool dispatches() const { return kind_ != Kind::kSleeper; }
  bool is_backup() const { return kind_ == Kind::kBackup; }

  // The waiter's place among the live entries of the queue when it planned: 0 is the oldest.
  void place(std::size_t k, Clock::time_point now) {
    if (k == 0)
      become_oldest(now);
    else
      kind_ = k < kDispatchers ? Kind::kBackup : Kind::kSleeper;
  }

  // A wake-up said that a waiter before this one left: it dispatches now, and is perhaps the
  // oldest. Applied by start_round().
  void hear_promotion(bool promoted, bool made_oldest) {
    promoted_ |= promoted;
    made_oldest_ |= made_oldest;
  }
  // Whether a wake-up made it the oldest since the round began (a backup then stops waiting out
  // its delay).
  bool made_oldest_pending() const { return made_oldest_; }

  // At the start of a round: applies a promotion heard, if the request is in the queue. Returns
  // true where it was a sleeper and must start to follow releases now.
  bool start_round(bool in_queue, Clock::time_point now) {
    bool starts_watching = false;
    if (promoted_ && in_queue) {
      if (kind_ == Kind::kSleeper) {
        kind_ = Kind::kBackup;
        starts_watching = true;
      }
      recheck_cheaply_ = true;  // it looks whether a GPU is free, as any new dispatcher does
      if (made_oldest_) become_oldest(now);
    }
    promoted_ = made_oldest_ = false;
    return starts_watching;
  }

  // Whether this round may keep the last plan if every GPU is held; asking clears it.
  bool take_cheap_recheck() {
    const bool cheap = recheck_cheaply_;
    recheck_cheaply_ = false;
    return cheap;
  }
  // It has just started to watch: the next round looks at the locks again, cheaply.
  void recheck_cheaply() { recheck_cheaply_ = true; }

  // After a sleep: woken to plan (its FIFO, or the watched waiter ended), or by an event or a
  // quick re-check. A wake to plan drops a promotion heard meanwhile: the plan decides.
  void woke(bool must_plan, bool event_or_quick) {
    recheck_cheaply_ = dispatches() && !must_plan && event_or_quick;
    if (must_plan) promoted_ = false;
  }

  // The oldest waiter sweeps the queue once per `interval`, counted from when it last swept or
  // became the oldest: in a queue served quickly the waiters that become the oldest in turn do
  // not each read every ticket as they come to the front.
  bool sweep_due(Clock::time_point now, Clock::duration interval) const {
    return kind_ == Kind::kOldest && now - last_sweep_ >= interval;
  }
  void swept(Clock::time_point now) { last_sweep_ = now; }

 private:
  void become_oldest(Clock::time_point now) {
    if (kind_ != Kind::kOldest) last_sweep_ = now;
    kind_ = Kind::kOldest;
  }

  Kind kind_ = Kind::kSleeper;
  bool promoted_ = false;
  bool made_oldest_ = false;
  bool recheck_cheaply_ = false;
  Clock::time_point last_sweep_;
};

// The kernel queues IN_CLOSE_WRITE just before it drops the closed file's OFD lock, so a waiter
// woken by a release can find the lock still held for a moment. After each wake-up it therefore
// checks again after these short pauses (or at once on a further event) before sleeping long.
// The later ones cover a closing process preempted between the two steps on a loaded machine.
class QuickRechecks {
 public:
  // A wake-up: the pauses start again from the first.
  void arm() { left_ = std::size(kPauses); }
  // The next pause, if any is left (taking it).
  std::optional<std::chrono::milliseconds> take() {
    if (left_ == 0) return std::nullopt;
    return kPauses[std::size(kPauses) - left_--];
  }

 private:
  static constexpr std::chrono::milliseconds kPauses[] = {
      std::chrono::milliseconds(1), std::chrono::milliseconds(4), std::chrono::milliseconds(20),
      std::chrono::milliseconds(100), std::chrono::milliseconds(500)};
  std::size_t left_ = 0;
};

}  // namespace gpulock
