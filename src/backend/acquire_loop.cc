// run_acquire_loop(): the wait of an acquire above a backend's round (acquire_loop.h).
#include "backend/acquire_loop.h"

#include <algorithm>

#include "backend/request_checks.h"

namespace gpulock {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void AcquireRound::recover(const Error& error, Clock::time_point deadline, bool last_look) {
  (void)error, (void)deadline, (void)last_look;
  throw;
}

AcquireWait start_acquire(const LeaseRequest& request, const std::string& user,
                          const Config& config) {
  validate_request(request);
  AcquireWait wait;
  wait.start = Clock::now();
  wait.deadline = wait_deadline(request, wait.start);
  wait.needed = request.gpus.empty() ? request.count : request.gpus.size();
  check_gpu_limit(wait.needed, user, config);
  return wait;
}

Lease run_acquire_loop(AcquireRound& round, const LeaseRequest& request, const WaitHooks& hooks,
                       const AcquireWait& wait) {
  std::string last_progress;
  bool reported = false;
  while (true) {
    const bool last_look = Clock::now() >= wait.deadline;
    try {
      RoundOutcome outcome = round.look();
      if (outcome.lease) return std::move(*outcome.lease);
      if (!outcome.not_served) continue;
      NotServed& why = *outcome.not_served;
      if (!request.wait || Clock::now() >= wait.deadline) throw std::move(why.refusal);
      round.keep_waiting(std::move(why.refusal));
      if (hooks.on_progress &&
          (!reported || why.signature != last_progress || hooks.progress_refresh)) {
        reported = true;
        last_progress = std::move(why.signature);
        why.progress.waited = Clock::now() - wait.start;
        hooks.on_progress(why.progress);
      }
      round.sleep(wait.deadline);
    } catch (const Error& error) {
      round.recover(error, wait.deadline, last_look);
    }
  }
}

milliseconds sleep_slice(Clock::time_point until, Clock::time_point deadline,
                         const WaitHooks& hooks) {
  auto slice = std::chrono::ceil<milliseconds>(until - Clock::now());
  if (hooks.interrupted) slice = std::min(slice, hooks.interrupt_poll);
  if (hooks.progress_refresh) slice = std::min(slice, *hooks.progress_refresh);
  if (deadline != Clock::time_point::max())
    slice =
        std::min(slice, std::chrono::ceil<milliseconds>(deadline - Clock::now()) + milliseconds(1));
  return std::max(slice, milliseconds(0));
}

void check_interrupted(const WaitHooks& hooks, const char* message) {
  if (hooks.interrupted && hooks.interrupted()) throw Error(ErrorCode::kInterrupted, message);
}

}  // namespace gpulock
