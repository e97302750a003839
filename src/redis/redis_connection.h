// RedisConnection: one synchronous connection to the Redis server (hiredis), logged in and on the
// pool's database, with replies copied into plain values and server-side scripts run by SHA.
//
// Every failure to reach or talk to the server throws Error(kEnvironment) (exit 69) naming the
// endpoint with its password masked; the connection is then broken() and must be replaced. A
// used connection that the server closed while it was idle is reconnected once, transparently.
// Error replies from the server are values (RedisValue::Type::kError), not exceptions.
// Not thread-safe: one connection per thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "redis/redis_url.h"

struct redisContext;

namespace gpulock {

struct RedisValue {
  enum class Type { kNil, kInteger, kString, kStatus, kError, kArray };
  Type type = Type::kNil;
  long long integer = 0;
  std::string text;  // kString, kStatus, kError
  std::vector<RedisValue> elements;

  bool is_error() const { return type == Type::kError; }
  bool is_nil() const { return type == Type::kNil; }
};

// A Lua script run with EVALSHA. Its SHA-1 is learnt from SCRIPT LOAD the first time and kept
// for the process; a server that lost it (restart, SCRIPT FLUSH) gets it again.
struct RedisScript {
  const char* name;
  const char* source;
};

class RedisConnection {
 public:
  // Connects, authenticates and selects the database. Throws kEnvironment.
  static std::unique_ptr<RedisConnection> connect(const RedisEndpoint& endpoint,
                                                  std::chrono::milliseconds timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  RedisValue command(const std::vector<std::string>& args);
  // Runs a script; an error reply from it throws kEnvironment with the script's name (a script
  // error is a server problem: permissions, memory, a server too old).
  RedisValue run(const RedisScript& script, const std::vector<std::string>& keys,
                 const std::vector<std::string>& args);

  // How long a command may take before it fails (and breaks the connection).
  void set_timeout(std::chrono::milliseconds timeout);
  // Until cleared (nullopt), each command may take at most what is left before `deadline` (at
  // least 1 ms), and never more than the timeout: a caller with a deadline of its own (a request's
  // --timeout) then ends on time against a server that never answers, whichever calls it makes.
  void set_deadline(std::optional<std::chrono::steady_clock::time_point> deadline);
  bool broken() const { return broken_; }
  // In a forked child: forget the parent's socket without touching it (the parent still uses
  // it); the connection is broken afterwards.
  void abandon_after_fork();
  const RedisEndpoint& endpoint() const { return endpoint_; }

  // Pub/sub: after subscribe(), the connection only receives messages. next_message() returns
  // the next message's payload, or nullopt when `timeout` passes or a signal interrupts it.
  void subscribe(const std::string& channel);
  std::optional<std::string> next_message(std::chrono::milliseconds timeout);

 private:
  RedisConnection(redisContext* context, RedisEndpoint endpoint);
  [[noreturn]] void fail(const std::string& doing);
  // The most the next command may take: the timeout, or less before the deadline.
  std::chrono::milliseconds call_timeout() const;
  RedisValue checked(void* reply, const std::string& doing);

  redisContext* context_;
  RedisEndpoint endpoint_;
  std::chrono::milliseconds timeout_{5000};
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  bool broken_ = false;
  bool used_ = false;  // a command has completed on it (it may have sat idle since)
};

// "message" from a reply: the error text of an error, else "".
std::string redis_error_text(const RedisValue& value);

}  // namespace gpulock
