// `gpulock doctor`: checks the backend (Redis connection, login, version, scripts, keys) and the
// devices, one line per check; exit 0 when nothing failed, 69 otherwise.
#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {

void add_doctor_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "doctor", "Check the set-up: the backend's connection and permissions, the devices");
  auto backend = std::make_shared<std::string>();
  add_backend_option(*command, *backend);
  command->callback([backend, exit_status] {
    GpuPool pool = open_pool(*backend);
    bool failed = false;
    for (const auto& check : pool.doctor()) {
      failed = failed || check.level == DoctorCheck::Level::kFailed;
      fmt::print("{:<8} {}: {}\n", doctor_level_name(check.level), check.name, check.detail);
    }
    *exit_status = failed ? 69 : 0;
  });
}

}  // namespace gpulock::cli
