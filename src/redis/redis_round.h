// RedisBackend::Round: what the exclusive and the shared acquire on a Redis pool share, below
// run_acquire_loop() (acquire_loop.h): the request's connection and its call budget, this
// host's registered devices, and the outage a waiting request rides out (RedisOutage). The two
// rounds are RedisBackend::ExclusiveRound (redis_acquire.cc) and RedisBackend::SharedRound
// (redis_acquire_shared.cc).
#pragma once

#include <string>
#include <vector>

#include "backend/acquire_loop.h"
#include "redis/redis_backend.h"
#include "redis/redis_call_budget.h"
#include "redis/redis_outage.h"
#include "redis/redis_request_scope.h"

namespace gpulock {

class RedisBackend::Round : public AcquireRound {
 public:
  // Connects, and registers this host's devices. `interrupted`: the message of an interrupt.
  Round(RedisBackend& pool, const LeaseRequest& request, const WaitHooks& hooks,
        const AcquireWait& wait, std::string user, const char* interrupted);

  void keep_waiting(Error refusal) override { outage_.left_waiting(std::move(refusal)); }
  // A server that goes away, or refuses requests, while the request waits (or before it
  // answered an acquire script) is waited out, retrying every second until the deadline. Before
  // either, an unreachable server is an error (exit 69), and so is an error of the pool's data.
  void recover(const Error& error, Clock::time_point deadline, bool last_look) override;

 protected:
  // At the start of a look: fresh readings of this host's devices (after the first look), and
  // the server reached again after an outage.
  void begin_look();
  // Whether an acquire script was sent whose answer has not come: the request then waits an
  // outage out, whether it waited before or not, since only the server can say if it ran.
  virtual bool answer_pending() const = 0;
  // Whether the server answered the failed call (with an error) rather than went away.
  virtual bool server_answered() const { return !connection_.broken(); }
  // Around the pause of an outage: what the round drops (its wake connection) and makes again.
  virtual void before_retry() {}
  virtual void after_retry() {}
  // The throw of an error that waiting cannot help (tokens exhausted, a garbage reply).
  [[noreturn]] void fail(Error error) {
    cannot_retry_ = true;
    throw std::move(error);
  }
  // Sent when a reply cannot be made a lease (taken GPUs are given back at once): its error is
  // then no outage to wait out either.
  void cannot_retry() { cannot_retry_ = true; }

  RedisBackend& pool_;
  const LeaseRequest& request_;
  const WaitHooks& hooks_;
  const AcquireWait& wait_;
  const std::string user_;
  const RequestHosts scope_;
  // Whether plans count the user's GPUs against a max_gpus limit (then they need those the
  // user holds on every host).
  const bool limited_;
  const RedisCallBudget calls_;
  RedisConnectionLoan connection_;
  std::vector<Device> local_devices_;  // this host's, as the round's plan reads them
  RedisOutage outage_;
  bool has_waited_ = false;  // set by the round once the request counts as waiting

 private:
  bool first_look_ = true;
  bool cannot_retry_ = false;
};

}  // namespace gpulock
