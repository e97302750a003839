// LocalBackend::doctor(): the checks of the local (file) backend's set-up.
#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "local/local_backend.h"

namespace gpulock {

std::vector<DoctorCheck> LocalBackend::doctor() {
  using Level = DoctorCheck::Level;
  std::vector<DoctorCheck> checks;
  checks.push_back({Level::kOk, "backend",
                    fmt::format("file: lock files in {} (GPULOCK_BACKEND or the config's "
                                "`backend` selects Redis)",
                                dir_.path().string())});
  for (const auto& warning : dir_.warnings())
    checks.push_back({Level::kWarning, "lock directory", warning});
  for (const auto& advice : dir_.advice())
    checks.push_back({Level::kWarning, "lock directory", advice});
  try {
    const auto devices = source_->devices();
    checks.push_back({Level::kOk, "devices",
                      fmt::format("{}: {} GPU{}", source_->description(), devices.size(),
                                  devices.size() == 1 ? "" : "s")});
  } catch (const Error& error) {
    checks.push_back({Level::kFailed, "devices", error.what()});
  }
  checks.push_back({Level::kOk, "config",
                    config_.source.empty() ? "no config file (defaults)" : config_.source});
  return checks;
}

}  // namespace gpulock
