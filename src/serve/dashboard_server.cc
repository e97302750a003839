// DashboardServer (serve/dashboard_server.h): routes, limits and error answers of `gpulock serve`.
#include "serve/dashboard_server.h"

#include <sys/socket.h>

#include <cctype>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "gpulock/error.hpp"
#include "serve/dashboard_assets.h"
#include "serve/elastic_task_queue.h"
#include "serve/status_cache.h"

namespace gpulock::serve {
namespace {

constexpr const char* kJson = "application/json";
constexpr const char* kMetrics = "text/plain; version=0.0.4; charset=utf-8";

void answer_error(httplib::Response& response, int status, const std::string& message) {
  response.status = status;
  response.set_content(nlohmann::json{{"error", message}}.dump() + "\n", kJson);
}

std::string error_text(int status) {
  switch (status) {
    case 400:
      return "bad request (malformed, or a header line over 8 KiB)";
    case 404:
      return "no such page";
    case 413:
      return "request body too large";
    case 414:
      return "request line too long";
    default:
      return fmt::format("HTTP error {}", status);
  }
}

}  // namespace

void parse_listen_address(const std::string& text, ServeOptions& options) {
  auto bad = [&text](const std::string& why) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--listen '{}': {} (use HOST:PORT, e.g. 127.0.0.1:9400)", text, why));
  };
  const auto colon = text.rfind(':');
  if (colon == std::string::npos) bad("no port");
  std::string host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string::npos)
    bad("write an IPv6 address in brackets");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    bad("the port must be a number from 0 to 65535");
  const int number = std::stoi(port);
  if (number > 65535) bad("the port must be a number from 0 to 65535");
  options.host = host.empty() ? "0.0.0.0" : host;
  options.port = number;
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host == "::1" ||
         (host.rfind("127.", 0) == 0 && host.find_first_not_of("0123456789.") == std::string::npos);
}

bool host_header_allowed(const std::string& host_header, const std::string& listen_host) {
  if (!is_loopback_host(listen_host) || host_header.empty()) return true;
  std::string name;
  if (host_header.front() == '[') {
    const auto end = host_header.find(']');
    if (end == std::string::npos) return false;
    name = host_header.substr(1, end - 1);
  } else {
    name = host_header.substr(0, host_header.find(':'));
  }
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return is_loopback_host(name) || name == "localhost.";
}

struct DashboardServer::Impl {
  GpuPool& pool;
  ServeOptions options;
  httplib::Server server;
  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;
  bool listening_done = false;
  int listening_fd = -1;  // the socket httplib listens on, once bound

  Impl(GpuPool& p, ServeOptions o) : pool(p), options(std::move(o)) {}

  void routes(StatusCache& cache) {
    const auto answer_from_cache = [&cache](httplib::Response& response, auto field,
                                            const char* type) {
      const auto snapshot = cache.current();
      if (!snapshot->error.empty()) return answer_error(response, 503, snapshot->error);
      response.set_content((*snapshot).*field, type);
    };
    server.Get("/api/status", [=](const httplib::Request&, httplib::Response& response) {
      answer_from_cache(response, &Snapshot::status_json, kJson);
    });
    server.Get("/api/queue", [=](const httplib::Request&, httplib::Response& response) {
      answer_from_cache(response, &Snapshot::queue_json, kJson);
    });
    server.Get("/metrics", [=](const httplib::Request&, httplib::Response& response) {
      answer_from_cache(response, &Snapshot::metrics, kMetrics);
    });
    server.Get("/api/usage", [this](const httplib::Request& request, httplib::Response& response) {
      if (!options.usage) return answer_error(response, 503, "usage journal not available");
      const std::string since =
          request.has_param("since") ? request.get_param_value("since") : "28d";
      const std::string by = request.has_param("by") ? request.get_param_value("by") : "user,day";
      try {
        response.set_content(options.usage(since, by), kJson);
      } catch (const Error& e) {
        answer_error(response, e.code() == ErrorCode::kInvalidArgument ? 400 : 503, e.what());
      }
    });
    for (const Asset& asset : dashboard_assets()) {
      // httplib takes a route as a regular expression: the name's dots are escaped, so that
      // only the asset's exact path matches.
      std::string path = "/";
      if (asset.name != "index.html")
        for (char c : asset.name) path += c == '.' ? std::string("\\.") : std::string(1, c);
      server.Get(path, [&asset](const httplib::Request&, httplib::Response& response) {
        response.set_content(std::string(asset.body), std::string(asset.content_type).c_str());
      });
    }
    // Only the routes above exist; anything else, and every error httplib itself answers
    // (400 malformed, 413, 414), gets a short JSON body.
    // The server is read-only: other methods on any path are refused.
    const auto refuse = [](const httplib::Request&, httplib::Response& response) {
      response.set_header("Allow", "GET, HEAD");
      answer_error(response, 405, "read-only: only GET and HEAD are served");
    };
    server.Post(".*", refuse);
    server.Put(".*", refuse);
    server.Patch(".*", refuse);
    server.Delete(".*", refuse);
    server.Options(".*", refuse);
    server.set_pre_routing_handler(
        [this](const httplib::Request& request, httplib::Response& response) {
          if (host_header_allowed(request.get_header_value("Host"), options.host))
            return httplib::Server::HandlerResponse::Unhandled;
          answer_error(response, 403,
                       "this server answers only to loopback names (Host: 127.0.0.1 or localhost)");
          return httplib::Server::HandlerResponse::Handled;
        });
    server.set_error_handler([](const httplib::Request&, httplib::Response& response) {
      if (!response.body.empty()) return;  // a handler's own answer
      answer_error(response, response.status, error_text(response.status));
    });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
          answer_error(response, 500, "internal error");
        });
    server.set_default_headers(
        {{"Cache-Control", "no-store"},
         {"X-Content-Type-Options", "nosniff"},
         {"Referrer-Policy", "no-referrer"},
         {"Content-Security-Policy",
          "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
          "frame-ancestors 'none'"},
         {"X-Frame-Options", "DENY"}});
  }
};

DashboardServer::DashboardServer(GpuPool& pool, ServeOptions options)
    : impl_(std::make_unique<Impl>(pool, std::move(options))) {}

DashboardServer::~DashboardServer() = default;

void DashboardServer::run() {
  Impl& s = *impl_;
  StatusCache cache(s.pool, s.options.show_commands, s.options.refresh_interval);
  s.routes(cache);
  const std::size_t threads = s.options.threads;
  s.server.new_task_queue = [threads] { return new ElasticTaskQueue(threads); };
  s.server.set_read_timeout(s.options.io_timeout);
  s.server.set_write_timeout(s.options.io_timeout);
  // Dashboards poll every 2 s: a connection kept open between polls would only hold a thread.
  s.server.set_keep_alive_max_count(1);
  s.server.set_payload_max_length(64 * 1024);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second server
  // bind the same port and silently share its clients.
  s.server.set_socket_options([&s](int fd) {
    const int on = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    s.listening_fd = fd;
  });

  int port = s.options.port;
  if (port == 0) {
    port = s.server.bind_to_any_port(s.options.host);
  } else if (!s.server.bind_to_port(s.options.host, port)) {
    port = -1;
  }
  if (port < 0)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("cannot listen on {}:{} (in use, or not an address of this machine)",
                            s.options.host, s.options.port));
  // httplib listens with a backlog of 5: when a few hundred dashboards connect at once, the
  // kernel drops their SYNs and each retries a second later. Listening again raises it.
  if (s.listening_fd >= 0) ::listen(s.listening_fd, SOMAXCONN);
  if (s.options.on_listening) s.options.on_listening(port);

  // stop() may come before listen_after_bind() has started, when httplib's own stop() would
  // do nothing: this thread repeats it until the listening loop has ended.
  std::thread stopper([&s] {
    std::unique_lock<std::mutex> lock(s.mutex);
    s.changed.wait(lock, [&s] { return s.stopping || s.listening_done; });
    while (!s.listening_done) {
      lock.unlock();
      s.server.stop();
      lock.lock();
      s.changed.wait_for(lock, std::chrono::milliseconds(50), [&s] { return s.listening_done; });
    }
  });
  s.server.listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.listening_done = true;
  }
  s.changed.notify_all();
  stopper.join();
}

void DashboardServer::stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
}

}  // namespace gpulock::serve
