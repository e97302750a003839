// RedisConnection over hiredis's synchronous API.
#include "redis/redis_connection.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>

#include <hiredis/hiredis.h>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "util/strings.h"

namespace gpulock {
namespace {

timeval to_timeval(std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  return tv;
}

// hiredis's reader builds each reply through these, straight into RedisValues: the root is a
// new RedisValue, and every element is built in its slot of the array above it (sized once, when
// the array's header is read). Before, the reader built its own redisReply objects and they were
// copied: two allocations or more per element, ~7,000 elements in a 100-host snapshot.
RedisValue* slot_for(const redisReadTask* task) {
  if (task->parent == nullptr) return new RedisValue;
  auto* parent = static_cast<RedisValue*>(task->parent->obj);
  if (parent == nullptr || task->idx < 0 ||
      static_cast<std::size_t>(task->idx) >= parent->elements.size())
    return nullptr;  // not what the reader promises: it fails the reply as out of memory
  return &parent->elements[static_cast<std::size_t>(task->idx)];
}

// Fills the slot for `task`; nullptr (the reader's "out of memory") where that fails.
template <typename Fill>
void* build_value(const redisReadTask* task, Fill fill) noexcept {
  RedisValue* value = nullptr;
  try {
    value = slot_for(task);
    if (value != nullptr) fill(*value);
    return value;
  } catch (...) {
    if (task->parent == nullptr) delete value;  // a root of our own; an element is its array's
    return nullptr;
  }
}

void* create_string(const redisReadTask* task, char* text, size_t length) {
  return build_value(task, [&](RedisValue& value) {
    value.type = task->type == REDIS_REPLY_ERROR    ? RedisValue::Type::kError
                 : task->type == REDIS_REPLY_STATUS ? RedisValue::Type::kStatus
                                                    : RedisValue::Type::kString;
    value.text.assign(text, length);
  });
}

// The element count is an int in hiredis 0.14 and a size_t from 1.0 on: one body serves both.
constexpr auto create_array = [](const redisReadTask* task, auto count) -> void* {
  return build_value(task, [&](RedisValue& value) {
    value.type = RedisValue::Type::kArray;
    value.elements.resize(count > 0 ? static_cast<std::size_t>(count) : 0);
  });
};

void* create_integer(const redisReadTask* task, long long number) {
  return build_value(task, [&](RedisValue& value) {
    value.type = RedisValue::Type::kInteger;
    value.integer = number;
  });
}

void* create_nil(const redisReadTask* task) {
  return build_value(task, [](RedisValue& value) { value.type = RedisValue::Type::kNil; });
}

// Called for a reply's root only (an element belongs to its array).
void free_value(void* value) {
  delete static_cast<RedisValue*>(value);
}

redisReplyObjectFunctions value_functions() {
  redisReplyObjectFunctions functions{};
  functions.createString = create_string;
  functions.createArray = create_array;
  functions.createInteger = create_integer;
  functions.createNil = create_nil;
  functions.freeObject = free_value;
  return functions;
}

redisReplyObjectFunctions reply_functions = value_functions();

struct ReplyDeleter {
  void operator()(void* reply) const { free_value(reply); }
};

// The SHA-1 of each script, as the server reported it.
std::mutex script_shas_mutex;
std::map<const char*, std::string> script_shas;

}  // namespace

std::string redis_error_text(const RedisValue& value) {
  return value.is_error() ? value.text : std::string();
}

RedisConnection::RedisConnection(redisContext* context, RedisEndpoint endpoint)
    : context_(context), endpoint_(std::move(endpoint)) {}

RedisConnection::~RedisConnection() {
  if (context_) redisFree(context_);
}

std::unique_ptr<RedisConnection> RedisConnection::connect(const RedisEndpoint& endpoint,
                                                          std::chrono::milliseconds timeout) {
  redisContext* context =
      redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, to_timeval(timeout));
  if (context == nullptr)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("cannot connect to Redis at {}: out of memory", endpoint.display()));
  std::unique_ptr<RedisConnection> connection(new RedisConnection(context, endpoint));
  if (context->err) {
    throw Error(ErrorCode::kEnvironment,
                fmt::format("cannot connect to Redis at {}: {} (is redis-server running there? "
                            "{} names it)",
                            endpoint.display(), sanitize_for_display(context->errstr, 200),
                            endpoint.named_by));
  }
  // Replies are built as RedisValues (see reply_functions).
  context->reader->fn = &reply_functions;
  // Commands that gpulock runs must not inherit the connection.
  ::fcntl(context->fd, F_SETFD, ::fcntl(context->fd, F_GETFD) | FD_CLOEXEC);
  redisSetTimeout(context, to_timeval(timeout));
  connection->timeout_ = timeout;
  redisEnableKeepAlive(context);
  if (!endpoint.password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!endpoint.user.empty()) auth.push_back(endpoint.user);
    auth.push_back(endpoint.password);
    const RedisValue reply = connection->command(auth);
    if (reply.is_error())
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("Redis at {} refused the login: {}", endpoint.display(),
                              sanitize_for_display(reply.text, 200)));
  }
  if (endpoint.db != 0) {
    const RedisValue reply = connection->command({"SELECT", std::to_string(endpoint.db)});
    if (reply.is_error())
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("Redis at {}: cannot select database {}: {}", endpoint.display(),
                              endpoint.db, sanitize_for_display(reply.text, 200)));
  }
  return connection;
}

void RedisConnection::fail(const std::string& doing) {
  broken_ = true;
  const std::string why =
      context_->err ? sanitize_for_display(context_->errstr, 200) : std::string("no reply");
  const bool timed_out = context_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == ETIMEDOUT);
  throw Error(ErrorCode::kEnvironment,
              fmt::format("Redis at {}: {} failed: {}", endpoint_.display(), doing,
                          timed_out ? "no answer in time (server paused or overloaded?)" : why));
}

RedisValue RedisConnection::checked(void* reply, const std::string& doing) {
  std::unique_ptr<void, ReplyDeleter> owned(reply);
  if (!owned || context_->err) fail(doing);
  return std::move(*static_cast<RedisValue*>(owned.get()));
}

RedisValue RedisConnection::command(const std::vector<std::string>& args) {
  if (broken_) fail(args.empty() ? "a command" : args.front());
  std::vector<const char*> argv;
  std::vector<std::size_t> lengths;
  for (const auto& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  if (deadline_) redisSetTimeout(context_, to_timeval(call_timeout()));
  void* reply =
      redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data());
  const int error_number = errno;
  const bool closed_by_server =
      reply == nullptr &&
      (context_->err == REDIS_ERR_EOF ||
       (context_->err == REDIS_ERR_IO && (error_number == ECONNRESET || error_number == EPIPE)));
  if (closed_by_server && used_) {
    // A connection that sat idle (in a cache) was closed by the server meanwhile (a restart,
    // its idle timeout, CLIENT KILL): the command never reached it. Connect again, once.
    std::unique_ptr<RedisConnection> fresh;
    try {
      fresh = connect(endpoint_, call_timeout());
    } catch (const Error&) {
      broken_ = true;  // this one is closed, and no other could be made
      throw;
    }
    std::swap(context_, fresh->context_);
    used_ = false;
    reply = redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), lengths.data());
  }
  RedisValue value = checked(reply, args.empty() ? "a command" : args.front());
  used_ = true;
  return value;
}

RedisValue RedisConnection::run(const RedisScript& script, const std::vector<std::string>& keys,
                                const std::vector<std::string>& args) {
  std::string sha;
  {
    std::lock_guard<std::mutex> lock(script_shas_mutex);
    if (const auto it = script_shas.find(script.source); it != script_shas.end()) sha = it->second;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (sha.empty()) {
      const RedisValue loaded = command({"SCRIPT", "LOAD", script.source});
      if (loaded.is_error() || loaded.type != RedisValue::Type::kString)
        throw Error(ErrorCode::kEnvironment,
                    fmt::format("Redis at {}: cannot load the {} script: {}", endpoint_.display(),
                                script.name, sanitize_for_display(loaded.text, 200)));
      sha = loaded.text;
      std::lock_guard<std::mutex> lock(script_shas_mutex);
      script_shas[script.source] = sha;
    }
    std::vector<std::string> call{"EVALSHA", sha, std::to_string(keys.size())};
    call.insert(call.end(), keys.begin(), keys.end());
    call.insert(call.end(), args.begin(), args.end());
    RedisValue reply = command(call);
    if (reply.is_error() && reply.text.starts_with("NOSCRIPT")) {
      sha.clear();  // the server restarted or flushed its scripts: load it again
      continue;
    }
    if (reply.is_error())
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("Redis at {}: the {} script failed: {}", endpoint_.display(),
                              script.name, sanitize_for_display(reply.text, 300)));
    return reply;
  }
  throw Error(ErrorCode::kEnvironment,
              fmt::format("Redis at {}: the {} script keeps disappearing (SCRIPT FLUSH?)",
                          endpoint_.display(), script.name));
}

void RedisConnection::abandon_after_fork() {
  context_->fd = -1;
  broken_ = true;
}

void RedisConnection::set_timeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  redisSetTimeout(context_, to_timeval(timeout));
}

void RedisConnection::set_deadline(std::optional<std::chrono::steady_clock::time_point> deadline) {
  deadline_ = deadline;
  if (!deadline_) redisSetTimeout(context_, to_timeval(timeout_));
}

std::chrono::milliseconds RedisConnection::call_timeout() const {
  if (!deadline_) return timeout_;
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - std::chrono::steady_clock::now());
  return std::clamp(left, std::chrono::milliseconds(1),
                    std::max(timeout_, std::chrono::milliseconds(1)));
}

void RedisConnection::subscribe(const std::string& channel) {
  const RedisValue reply = command({"SUBSCRIBE", channel});
  if (reply.type != RedisValue::Type::kArray)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("Redis at {}: cannot subscribe to {}: {}", endpoint_.display(), channel,
                            sanitize_for_display(reply.text, 200)));
}

std::optional<std::string> RedisConnection::next_message(std::chrono::milliseconds timeout) {
  if (broken_) fail("waiting for a message");
  void* raw = nullptr;
  if (redisGetReplyFromReader(context_, &raw) != REDIS_OK) fail("reading a message");
  if (raw == nullptr) {
    pollfd pfd{context_->fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
    if (ready <= 0) return std::nullopt;  // timed out, or a signal: the caller checks
    if (redisBufferRead(context_) != REDIS_OK) fail("reading a message");
    if (redisGetReplyFromReader(context_, &raw) != REDIS_OK) fail("reading a message");
    if (raw == nullptr) return std::nullopt;  // part of a message: the rest comes later
  }
  const RedisValue value = checked(raw, "reading a message");
  // ["message", channel, payload]
  if (value.type == RedisValue::Type::kArray && value.elements.size() == 3 &&
      value.elements[0].text == "message")
    return value.elements[2].text;
  return std::string();
}

}  // namespace gpulock
