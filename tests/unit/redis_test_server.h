// RedisTestServer: a real redis-server for one test, on a free 127.0.0.1 port, in a temporary
// directory of its own, without persistence (--save "" --appendonly no). It is killed when the
// object is destroyed, and (PR_SET_PDEATHSIG) when the thread that started it dies, so no test
// leaves a server behind. A missing redis-server is a test failure, never a skip.
//
//   RedisTestServer server;                          // started, answers PING
//   server.url()                                     // "redis://127.0.0.1:PORT/0"
//   server.command({"SET", "k", "v"})                // as the default user
//   server.restart();                                // SIGTERM, then again on the same port: empty
//
// Create and destroy it on the test's main thread (the death signal follows the starting thread).
// Every wait here is a hang guard, never a timing assumption.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "redis/redis_connection.h"
#include "redis/redis_url.h"
#include "temp_dir.h"

namespace gpulock::test_support {

struct RedisTestServerOptions {
  std::string password;  // requirepass for the default user; "" = none
  // An ACL user (name, password) allowed everything on gpulock:* keys and channels.
  std::optional<std::pair<std::string, std::string>> acl_user;
};

class RedisTestServer {
 public:
  // Starts the server; throws std::runtime_error (a test failure) when it cannot.
  explicit RedisTestServer(RedisTestServerOptions options = {});
  ~RedisTestServer();
  RedisTestServer(const RedisTestServer&) = delete;
  RedisTestServer& operator=(const RedisTestServer&) = delete;

  // SIGTERM (SIGKILL if it does not exit within a hang guard), and waits for it: every key is
  // lost. start() again on the same port, empty, with the same users.
  void stop();
  void start();
  void restart() {
    stop();
    start();
  }
  bool running() const { return pid_ > 0; }

  int port() const { return port_; }
  // redis://[user:password@]127.0.0.1:PORT/db
  std::string url(const std::string& user = "", const std::string& password = "", int db = 0) const;
  // The endpoint of the default user (with the server's password, if any).
  RedisEndpoint endpoint() const;
  // A new connection as the default user.
  std::unique_ptr<RedisConnection> connect(
      std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  // One command as the default user, on a connection kept by this object (re-made after a
  // restart). Error replies are values; a failure to talk to the server throws Error.
  RedisValue command(const std::vector<std::string>& args);

  // The end of the server's log file, for failure messages.
  std::string log_tail(std::size_t limit = 4000) const;
  const std::filesystem::path& dir() const { return dir_.path(); }

 private:
  // One attempt on `port`; false when the port turned out to be taken.
  bool start_on(int port);
  void kill_now();

  RedisTestServerOptions options_;
  TempDir dir_{"redis"};
  std::filesystem::path log_path_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::unique_ptr<RedisConnection> admin_;
};

// A loopback port on which nothing listens (right now), for "wrong address" tests.
int closed_loopback_port();

// The redis-server binary (GPULOCK_REDIS_SERVER, /usr/bin/redis-server, then PATH), or throws
// std::runtime_error saying how to install it.
std::string redis_server_binary();

}  // namespace gpulock::test_support
