// `gpulock doctor`: checks the backend (Redis connection, login, version, scripts, keys) and the
// devices, one line per check; exit 0 when nothing failed, 69 otherwise.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

// The file of Debian's bash-completion package that loads every command's completions. Without
// it the completions gpulock installs are never read, and Tab silently completes nothing.
constexpr const char* kBashCompletionLoader = "/usr/share/bash-completion/bash_completion";

// For a bash user: whether Tab will complete gpulock's commands; nullopt for other shells.
std::optional<DoctorCheck> shell_completion_check() {
  const char* shell = std::getenv("SHELL");
  const std::string name =
      shell && *shell ? std::filesystem::path(shell).filename().string() : "bash";
  if (name != "bash") return std::nullopt;
  DoctorCheck check;
  check.name = "shell completion";
  if (::access(kBashCompletionLoader, R_OK) == 0) {
    check.detail = "bash-completion is installed: Tab completes gpulock's commands and job ids";
  } else {
    check.level = DoctorCheck::Level::kWarning;
    check.detail = fmt::format(
        "bash-completion is not installed ({} is missing), so Tab completes nothing for "
        "gpulock: apt install bash-completion, then open a new shell",
        kBashCompletionLoader);
  }
  return check;
}

}  // namespace

void add_doctor_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "doctor", "Check the set-up: the backend's connection and permissions, the devices");
  auto backend = std::make_shared<std::string>();
  add_backend_option(*command, *backend);
  command->callback([backend, exit_status] {
    GpuPool pool = open_pool(*backend);
    bool failed = false;
    std::vector<DoctorCheck> checks = pool.doctor();
    if (auto completion = shell_completion_check()) checks.push_back(std::move(*completion));
    for (const auto& check : checks) {
      failed = failed || check.level == DoctorCheck::Level::kFailed;
      fmt::print("{:<8} {}: {}\n", doctor_level_name(check.level), check.name, check.detail);
    }
    *exit_status = failed ? 69 : 0;
  });
}

}  // namespace gpulock::cli
