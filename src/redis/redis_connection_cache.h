// RedisConnectionCache: idle connections to one server, shared by a pool's threads and by the
// keepers of its leases, so that an acquire or a renewal does not pay for a new connection.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "redis/redis_connection.h"

namespace gpulock {

class RedisConnectionCache {
 public:
  RedisConnectionCache(RedisEndpoint endpoint, std::chrono::milliseconds timeout);

  // An idle connection, or a new one; its command timeout is `timeout` (the cache's default
  // when zero). Throws kEnvironment when the server cannot be reached.
  std::unique_ptr<RedisConnection> take(std::chrono::milliseconds timeout = {});
  // Keeps a healthy connection for the next take(); drops a broken one.
  void give_back(std::unique_ptr<RedisConnection> connection);
  // In a forked child: forgets the parent's connections without closing its sockets.
  void abandon_after_fork();

  const RedisEndpoint& endpoint() const { return endpoint_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  const RedisEndpoint endpoint_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<RedisConnection>> idle_;
};

// Takes a connection from a cache and gives it back when it goes out of scope.
class RedisConnectionLoan {
 public:
  explicit RedisConnectionLoan(RedisConnectionCache& cache, std::chrono::milliseconds timeout = {})
      : cache_(cache), connection_(cache.take(timeout)) {}
  ~RedisConnectionLoan() { cache_.give_back(std::move(connection_)); }
  RedisConnectionLoan(const RedisConnectionLoan&) = delete;
  RedisConnectionLoan& operator=(const RedisConnectionLoan&) = delete;
  // Replaces a broken connection with a working one, whose command timeout is `timeout` (the
  // cache's default when zero). Throws kEnvironment.
  void reconnect(std::chrono::milliseconds timeout = {}) {
    if (connection_ && !connection_->broken()) return;
    connection_.reset();
    connection_ = cache_.take(timeout);
  }
  // Whether there is no working connection (none since a reconnect failed, or a broken one).
  bool broken() const { return !connection_ || connection_->broken(); }
  RedisConnection* operator->() { return connection_.get(); }
  RedisConnection& operator*() { return *connection_; }

 private:
  RedisConnectionCache& cache_;
  std::unique_ptr<RedisConnection> connection_;
};

}  // namespace gpulock
