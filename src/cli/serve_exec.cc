// gpulock's `serve`: runs gpulock-serve, the same command line built with the HTTP server
// (serve_run.cc), with this process's arguments. Only that program links cpp-httplib, whose
// start-up (OpenSSL's initialisation and relocations) would otherwise cost every gpulock
// command, `gpulock run` in a queue's drain included, about half of its start.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "cli.h"
#include "gpulock/error.hpp"

namespace gpulock::cli {

void run_serve(const std::string&, const std::string&, int*) {
  // Beside this program (a build tree), or in its libexec directory (installed).
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error)
    throw Error(ErrorCode::kEnvironment,
                "cannot find gpulock-serve: /proc/self/exe is unreadable: " + error.message());
  const std::filesystem::path here = self.parent_path();
  const std::filesystem::path candidates[] = {
      here / "gpulock-serve",
      (here / GPULOCK_SERVE_FROM_BINDIR / "gpulock-serve").lexically_normal()};
  std::vector<char*> argv;
  for (std::string& argument : command_line) argv.push_back(argument.data());
  argv.push_back(nullptr);
  std::string looked;
  for (const auto& candidate : candidates) {
    ::execv(candidate.c_str(), argv.data());
    looked += fmt::format("{}{} ({})", looked.empty() ? "" : ", ", candidate.string(),
                          std::strerror(errno));
  }
  throw Error(ErrorCode::kEnvironment,
              "cannot run gpulock-serve, the program of `gpulock serve`: tried " + looked);
}

}  // namespace gpulock::cli
