// RedisOutage: how a request that waits on a Redis pool rides out a server that stops
// answering: one warning when the outage starts, a retry every second until the request's
// deadline (interrupts still stop it), one line when the server answers again, and what a
// request whose last look at the pool fails at its deadline ends with. Shared by
// the exclusive and the shared acquire, so that both say and do the same.
#pragma once

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "gpulock/error.hpp"
#include "gpulock/request.hpp"
#include "redis/redis_connection_cache.h"

namespace gpulock {

class RedisOutage {
 public:
  using Clock = std::chrono::steady_clock;

  // `interrupted` is the message of the kInterrupted error thrown when the caller's interrupt
  // fires while waiting.
  RedisOutage(const WaitHooks& hooks, const char* interrupted) noexcept
      : hooks_(hooks), interrupted_(interrupted) {}

  // The server failed with `error`: warns the first time, then sleeps until the next retry (a
  // second from now, never past `deadline`). `refused`: the server answered, with an error
  // (out of memory under `maxmemory`, a read-only replica, a script that failed): then a PING
  // proves nothing, and the outage ends only when a look at the pool is answered.
  void wait_to_retry(const Error& error, Clock::time_point deadline, bool refused = false);

  // At the start of a round, if an outage is ongoing: connects `connection` again (within
  // `connect_budget`, its calls bounded by `deadline` again), and once the server has answered
  // a PING says that it answers (unless the outage is a refusal; see wait_to_retry). Throws, as
  // the connection does, if it still does not.
  void end(RedisConnectionLoan& connection, std::chrono::milliseconds connect_budget,
           const std::optional<Clock::time_point>& deadline);

  // Sleeps until `until`, checking the caller's interrupt as often as it asks.
  void sleep_until(Clock::time_point until) const;

  // The server answered a look at the pool that left the request waiting: `refusal` (a
  // kTimedOut error) says why, for fail_at_deadline. An outage forgets it (wait_to_retry).
  void left_waiting(Error refusal);

  // The request's deadline has passed and a call failed with `error`. If that call belongs to
  // the request's last look at the pool (`last_look`: the round begun at the deadline, whose calls
  // get what is left of it, so that on a loaded machine one may go unanswered), no outage was
  // going on, and the last look the server answered left the request waiting, it was not served
  // within its timeout: throws that refusal, saying how the last look failed. Otherwise throws
  // `error`.
  [[noreturn]] void fail_at_deadline(const Error& error, bool last_look) const;

 private:
  const WaitHooks& hooks_;
  const char* interrupted_;
  bool ongoing_ = false;
  bool refused_ = false;          // the ongoing outage is a server that answers with errors
  std::string endpoint_;          // the server's address, as end() last reached it
  std::optional<Error> refusal_;  // see left_waiting
};

// Runs an acquire script (`script` with `sent.args.argv()`), whose answer an outage may take away
// after the script ran. Until the server answers, `*unanswered` holds `sent`, for the caller to
// send again once the server is back; any answer clears it, an error reply included (the script did
// not run then, and that is no outage to wait out). Rethrows the connection's error.
template <typename Sent>
RedisValue run_until_answered(RedisConnectionLoan& connection, const RedisScript& script,
                              const std::vector<std::string>& keys, const Sent& sent,
                              std::optional<Sent>* unanswered) {
  *unanswered = sent;
  try {
    RedisValue reply = connection->run(script, keys, sent.args.argv());
    unanswered->reset();
    return reply;
  } catch (const Error&) {
    if (!connection->broken()) unanswered->reset();
    throw;
  }
}

}  // namespace gpulock
