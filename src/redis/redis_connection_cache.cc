// RedisConnectionCache: a small free list of connections.
#include "redis/redis_connection_cache.h"

namespace gpulock {
namespace {

constexpr std::size_t kMostIdle = 8;

}  // namespace

RedisConnectionCache::RedisConnectionCache(RedisEndpoint endpoint,
                                           std::chrono::milliseconds timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {}

std::unique_ptr<RedisConnection> RedisConnectionCache::take(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) timeout = timeout_;
  std::unique_ptr<RedisConnection> connection;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      connection = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (!connection) return RedisConnection::connect(endpoint_, std::min(timeout, timeout_));
  connection->set_deadline(std::nullopt);  // not its last user's
  connection->set_timeout(timeout);
  return connection;
}

void RedisConnectionCache::give_back(std::unique_ptr<RedisConnection> connection) {
  if (!connection || connection->broken()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_.size() < kMostIdle) idle_.push_back(std::move(connection));
}

void RedisConnectionCache::abandon_after_fork() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& connection : idle_) connection->abandon_after_fork();
  idle_.clear();
}

}  // namespace gpulock
