// gpulock-serve's `serve`: the read-only HTTP server of metrics, the JSON documents and the
// live dashboard (serve/dashboard_server.h), until SIGTERM or SIGINT. gpulock-serve is the
// command line of gpulock with this in place of serve_exec.cc; it alone links cpp-httplib
// (and through it OpenSSL, whose start-up every gpulock command would otherwise pay).
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "cli.h"
#include "serve/dashboard_server.h"
#include "serve/usage_documents.h"

namespace gpulock::cli {

void run_serve(const std::string& listen, const std::string& backend_option, int* exit_status) {
  const auto backend = std::make_shared<std::string>(backend_option);
  serve::ServeOptions options;
  serve::parse_listen_address(listen, options);
  // SIGTERM and SIGINT are taken by one thread (blocked in all others, which inherit the
  // mask: hence before the pool or the server start any), which stops the server; run()
  // then returns and gpulock exits 0.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  GpuPool pool = open_pool(*backend);
  options.show_commands = pool.config().serve_show_commands;
  // /api/usage, from the usage journal, read through a pool of its own.
  auto usage = std::make_shared<serve::UsageDocuments>([backend] { return open_pool(*backend); });
  options.usage = [usage](const std::string& since, const std::string& by) {
    return usage->document(since, by);
  };
  options.on_listening = [&options](int port) {
    const bool v6 = options.host.find(':') != std::string::npos;
    fmt::print(stderr, "gpulock serve: listening on http://{}{}{}:{}/\n", v6 ? "[" : "",
               options.host, v6 ? "]" : "", port);
    if (!serve::is_loopback_host(options.host))
      fmt::print(stderr,
                 "gpulock serve: warning: reachable from the network: anyone who can connect "
                 "sees who holds which GPU{}\n",
                 options.show_commands ? " and their full command lines" : "");
    std::fflush(stderr);
  };
  serve::DashboardServer server(pool, options);
  std::atomic<bool> finished{false};
  std::thread signal_waiter([&] {
    const timespec tick{0, 200 * 1000 * 1000};
    while (!finished.load()) {
      if (sigtimedwait(&stop_signals, nullptr, &tick) > 0) {
        server.stop();
        return;
      }
    }
  });
  try {
    server.run();
  } catch (...) {
    finished = true;
    signal_waiter.join();
    throw;
  }
  finished = true;
  signal_waiter.join();
  fmt::print(stderr, "gpulock serve: stopped\n");
  *exit_status = 0;
}

}  // namespace gpulock::cli
