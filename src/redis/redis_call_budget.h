// How long a request's calls to the Redis server may take. Every call is bounded by the
// request's deadline, so that --timeout and --no-wait end on time against a server that accepts
// connections but never answers; a request that does not wait still gets kLeastCallBudget for
// its few round trips. Without a deadline, calls get the connection's usual kLongestCall.
#pragma once

#include <chrono>
#include <optional>

namespace gpulock {

class RedisCallBudget {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kLeastCallBudget{1000};
  static constexpr std::chrono::milliseconds kLongestCall{5000};

  // For a request started at `start` that waits until `deadline` (time_point::max(): forever).
  RedisCallBudget(Clock::time_point deadline, Clock::time_point start);

  // When every call must have ended (for RedisConnection::set_deadline); nullopt: never.
  const std::optional<Clock::time_point>& deadline() const { return deadline_; }
  // The time a new connection may take to connect now (each command then keeps deadline()).
  std::chrono::milliseconds connect_budget() const;

 private:
  std::optional<Clock::time_point> deadline_;
};

}  // namespace gpulock
