// GpuPool::doctor() for the local (file) backend, and the names of the checks' levels.
#include <fmt/format.h>

#include "local/local_backend.h"
#include "gpulock/error.hpp"

namespace gpulock {

const char* doctor_level_name(DoctorCheck::Level level) noexcept {
  switch (level) {
    case DoctorCheck::Level::kOk:
      return "ok";
    case DoctorCheck::Level::kWarning:
      return "warning";
    case DoctorCheck::Level::kFailed:
      return "failed";
  }
  return "failed";
}

std::vector<DoctorCheck> GpuPool::Impl::doctor() {
  using Level = DoctorCheck::Level;
  std::vector<DoctorCheck> checks;
  checks.push_back({Level::kOk, "backend",
                    fmt::format("file: lock files in {} (GPULOCK_BACKEND or the config's "
                                "`backend` selects Redis)",
                                dir.path().string())});
  for (const auto& warning : dir.warnings())
    checks.push_back({Level::kWarning, "lock directory", warning});
  for (const auto& advice : dir.advice())
    checks.push_back({Level::kWarning, "lock directory", advice});
  try {
    const auto devices = source->devices();
    checks.push_back({Level::kOk, "devices",
                      fmt::format("{}: {} GPU{}", source->description(), devices.size(),
                                  devices.size() == 1 ? "" : "s")});
  } catch (const Error& error) {
    checks.push_back({Level::kFailed, "devices", error.what()});
  }
  checks.push_back(
      {Level::kOk, "config", config.source.empty() ? "no config file (defaults)" : config.source});
  return checks;
}

}  // namespace gpulock
