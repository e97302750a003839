// RedisBackend::acquire() and the part of its rounds that the exclusive and the shared acquire
// share (redis_round.h).
#include "redis/redis_round.h"

#include <unistd.h>

#include "process/process_identity.h"

namespace gpulock {

Lease RedisBackend::acquire(const LeaseRequest& request, const WaitHooks& hooks) {
  const bool shared = request.memory_bytes || request.slots;
  if (shared) check_shared_request(request);
  std::string user = user_name(::geteuid());
  const AcquireWait wait = start_acquire(request, user, config_);
  const std::unique_ptr<Round> round = shared
                                           ? shared_round(request, hooks, wait, std::move(user))
                                           : exclusive_round(request, hooks, wait, std::move(user));
  return run_acquire_loop(*round, request, hooks, wait);
}

RedisBackend::Round::Round(RedisBackend& pool, const LeaseRequest& request, const WaitHooks& hooks,
                           const AcquireWait& wait, std::string user, const char* interrupted)
    : pool_(pool),
      request_(request),
      hooks_(hooks),
      wait_(wait),
      user_(std::move(user)),
      scope_(request_hosts(request, pool.settings_.host)),
      limited_(pool.config_.limits_for(user_).max_gpus.has_value()),
      calls_(wait.deadline, wait.start),
      connection_(*pool.connections_, calls_.connect_budget()),
      outage_(hooks, interrupted) {
  connection_->set_deadline(calls_.deadline());
  local_devices_ = pool_.register_devices(*connection_);
}

void RedisBackend::Round::begin_look() {
  if (!first_look_) local_devices_ = pool_.source_->devices();
  first_look_ = false;
  // Back after an outage? (A server that restarted empty gets this host's registration again
  // from registered_snapshot().)
  outage_.end(connection_, calls_.connect_budget(), calls_.deadline());
}

void RedisBackend::Round::recover(const Error& error, Clock::time_point deadline, bool last_look) {
  if (error.code() != ErrorCode::kEnvironment || !(has_waited_ || answer_pending()) ||
      cannot_retry_)
    throw;
  if (Clock::now() >= deadline) outage_.fail_at_deadline(error, last_look && !answer_pending());
  const bool refused = server_answered();
  before_retry();
  outage_.wait_to_retry(error, deadline, refused);
  after_retry();
}

}  // namespace gpulock
