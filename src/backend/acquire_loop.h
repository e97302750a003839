// The wait of an acquire, written once for every backend: the deadline, the request's last look,
// the refusal of a request that may not wait (or waited long enough), the progress it reports,
// and interrupts. A backend supplies an AcquireRound: one look at its pool (which devices could
// serve, plan, take a placement, enter or leave the queue), and a sleep until the pool may have
// changed. Its errors go back to it, so that a pool on a server can ride out an outage.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "gpulock/config.hpp"
#include "gpulock/error.hpp"
#include "gpulock/lease.hpp"
#include "gpulock/request.hpp"

namespace gpulock {

// What a round says of a request it did not serve.
struct NotServed {
  Error refusal;          // what the request is told if it stops waiting now
  WaitProgress progress;  // what its wait shows (the loop sets `waited`)
  // The progress is reported again only when this changes, or when a live display refreshes.
  std::string signature;
};

// What one round made of the pool: a lease, why the request waits, or neither when the pool
// changed under the round (a stale plan, a ticket gone): the next round then starts at once.
struct RoundOutcome {
  std::optional<Lease> lease;
  std::optional<NotServed> not_served;

  static RoundOutcome served(Lease lease) { return RoundOutcome{std::move(lease), std::nullopt}; }
  static RoundOutcome waits(NotServed why) { return RoundOutcome{std::nullopt, std::move(why)}; }
  static RoundOutcome look_again() { return {}; }
};

// One backend's part of an acquire.
class AcquireRound {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~AcquireRound() = default;

  // One look at the pool.
  virtual RoundOutcome look() = 0;
  // The request goes on waiting; `refusal` is what it would have been told.
  virtual void keep_waiting(Error refusal) { (void)refusal; }
  // Sleeps until the pool may have changed, never past `deadline`. Throws kInterrupted when the
  // caller's interrupt asks.
  virtual void sleep(Clock::time_point deadline) = 0;
  // Called from the handler of an error thrown by a round (look, sleep, or the loop's refusal):
  // rethrows it with `throw;` (the default), or rides it out and returns to look again.
  // `last_look`: the round began at the deadline (a pool on a server gives its calls what is
  // left of it, so one may go unanswered).
  virtual void recover(const Error& error, Clock::time_point deadline, bool last_look);
};

// The clock of one acquire.
struct AcquireWait {
  std::chrono::steady_clock::time_point start;
  std::chrono::steady_clock::time_point deadline;  // see wait_deadline()
  std::size_t needed = 0;                          // how many GPUs it takes
};

// Checks a request (validate_request(), the max_gpus limit of `user`) and starts its clock.
AcquireWait start_acquire(const LeaseRequest& request, const std::string& user,
                          const Config& config);

// Runs rounds until one serves the request (its lease), or throws why it was not served.
Lease run_acquire_loop(AcquireRound& round, const LeaseRequest& request, const WaitHooks& hooks,
                       const AcquireWait& wait);

// How long one blocking wait of a sleep may last: until `until`, no later than just past
// `deadline`, and no longer than a live display's refresh or the caller's interrupt poll.
// Rounded up (rounding down would make a sleep's last millisecond a busy loop), never negative.
std::chrono::milliseconds sleep_slice(std::chrono::steady_clock::time_point until,
                                      std::chrono::steady_clock::time_point deadline,
                                      const WaitHooks& hooks);

// Throws kInterrupted with `message` when the caller's interrupt asks.
void check_interrupted(const WaitHooks& hooks, const char* message);

}  // namespace gpulock
