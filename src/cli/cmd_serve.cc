// `gpulock serve [--listen 127.0.0.1:9400]`: its options. The server itself is another program,
// gpulock-serve (serve_exec.cc, serve_run.cc), so that no other command loads the HTTP library.
#include <memory>

#include "cli.h"

namespace gpulock::cli {

void add_serve_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "serve", "Serve metrics, the JSON documents and a live dashboard over HTTP (read-only)");
  auto listen = std::make_shared<std::string>("127.0.0.1:9400");
  auto backend = std::make_shared<std::string>();
  command
      ->add_option("--listen", *listen,
                   "HOST:PORT to listen on (default 127.0.0.1:9400; port 0: any free port)")
      ->type_name("HOST:PORT");
  add_backend_option(*command, *backend);
  command->callback([listen, backend, exit_status] { run_serve(*listen, *backend, exit_status); });
}

}  // namespace gpulock::cli
