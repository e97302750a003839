// RedisCallBudget: see redis_call_budget.h.
#include "redis/redis_call_budget.h"

#include <algorithm>

namespace gpulock {

RedisCallBudget::RedisCallBudget(Clock::time_point deadline, Clock::time_point start) {
  if (deadline != Clock::time_point::max())
    deadline_ = std::max(deadline, start + kLeastCallBudget);
}

std::chrono::milliseconds RedisCallBudget::connect_budget() const {
  using std::chrono::milliseconds;
  if (!deadline_) return kLongestCall;
  const auto left = std::chrono::ceil<milliseconds>(*deadline_ - Clock::now());
  return std::clamp(left, milliseconds(1), kLongestCall);
}

}  // namespace gpulock
