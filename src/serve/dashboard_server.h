// DashboardServer: `gpulock serve`, a read-only HTTP server of the pool's state: /metrics
// (Prometheus), /api/status, /api/queue and /api/usage (the CLI's JSON documents) and the live
// dashboard page at /. Built on cpp-httplib with a bounded, growing thread pool and read/write
// timeouts.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gpulock/gpu_pool.hpp"

namespace gpulock::serve {

// Returns the usage document (as `gpulock usage --json`) for `since` ("28d", a date) grouped by
// `by` ("user", "day", "user,day"...). Throws Error(kInvalidArgument) for values it refuses.
using UsageProvider = std::function<std::string(const std::string& since, const std::string& by)>;

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 9400;  // 0: any free port (see on_listening)
  // Full command lines over HTTP (else program names only): the config's serve_show_commands.
  bool show_commands = false;
  std::chrono::milliseconds refresh_interval{1000};
  // Threads serving connections: started as connections come, up to this many (then they
  // wait their turn); each connection holds one until answered or io_timeout has passed.
  std::size_t threads = 256;
  std::chrono::seconds io_timeout{5};  // a client that sends or reads slower is dropped
  // /api/usage; unset: it answers 503 "usage journal not available".
  UsageProvider usage;
  // Called once the socket is bound, with the port (useful with port 0).
  std::function<void(int port)> on_listening;
};

// "127.0.0.1:9400", "[::1]:9400", ":9400" (all interfaces) into host and port. Throws
// Error(kInvalidArgument).
void parse_listen_address(const std::string& text, ServeOptions& options);

// "localhost", "::1" or a dotted address in 127.0.0.0/8 (not a name that merely begins so).
bool is_loopback_host(const std::string& host);

// Whether a request's Host header may be answered by a server listening on `listen_host`. On a
// loopback address only loopback names are (or no Host at all): a web page elsewhere whose
// name a browser was made to resolve to 127.0.0.1 (DNS rebinding) cannot read the documents.
// Any name is on other addresses, whose names the server cannot know.
bool host_header_allowed(const std::string& host_header, const std::string& listen_host);

class DashboardServer {
 public:
  DashboardServer(GpuPool& pool, ServeOptions options);
  ~DashboardServer();

  // Serves until stop(). Throws Error(kEnvironment) if the address cannot be bound.
  void run();
  // Safe from any thread, before or during run(): run() returns soon after.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpulock::serve
