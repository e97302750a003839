// RedisOutage: see redis_outage.h.
#include "redis/redis_outage.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

namespace gpulock {

void RedisOutage::wait_to_retry(const Error& error, Clock::time_point deadline, bool refused) {
  if (!ongoing_)
    std::fprintf(stderr, "gpulock: warning: %s; still waiting, retrying every second\n",
                 error.what());
  ongoing_ = true;
  refused_ = refused;
  refusal_.reset();  // from before the outage
  sleep_until(std::min(deadline, Clock::now() + std::chrono::seconds(1)));
}

void RedisOutage::end(RedisConnectionLoan& connection, std::chrono::milliseconds connect_budget,
                      const std::optional<Clock::time_point>& deadline) {
  if (!ongoing_) return;
  connection.reconnect(connect_budget);
  connection->set_deadline(deadline);
  // A connection is no answer: the kernel completes it for a server that is paused, shutting
  // down or not reading, and a cached connection may be dead. Only a reply counts.
  const RedisValue pong = connection->command({"PING"});
  if (pong.is_error())
    throw Error(ErrorCode::kEnvironment, fmt::format("Redis at {} is not ready: {}",
                                                     connection->endpoint().display(), pong.text));
  endpoint_ = connection->endpoint().display();
  if (refused_) return;  // it answered all along: only a look at the pool ends a refusal
  std::fprintf(stderr, "gpulock: Redis at %s answers again\n", endpoint_.c_str());
  ongoing_ = false;
}

void RedisOutage::left_waiting(Error refusal) {
  refusal_ = std::move(refusal);
  if (ongoing_ && refused_) {
    std::fprintf(stderr, "gpulock: Redis at %s accepts requests again\n", endpoint_.c_str());
    ongoing_ = false;
    refused_ = false;
  }
}

void RedisOutage::fail_at_deadline(const Error& error, bool last_look) const {
  if (!last_look || ongoing_ || !refusal_) throw error;
  throw Error(refusal_->code(),
              fmt::format("{}\n  (its last look at the pool, at the deadline, failed: {})",
                          refusal_->what(), error.what()));
}

void RedisOutage::sleep_until(Clock::time_point until) const {
  while (Clock::now() < until) {
    auto slice = until - Clock::now();
    if (hooks_.interrupted) slice = std::min<Clock::duration>(slice, hooks_.interrupt_poll);
    std::this_thread::sleep_for(slice);
    if (hooks_.interrupted && hooks_.interrupted())
      throw Error(ErrorCode::kInterrupted, interrupted_);
  }
}

}  // namespace gpulock
