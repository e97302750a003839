// DoctorCheck: one finding of `gpulock doctor` (GpuPool::doctor()) about the set-up.
#pragma once

#include <string>

namespace gpulock {

struct DoctorCheck {
  enum class Level { kOk, kWarning, kFailed };
  Level level = Level::kOk;
  std::string name;    // "connection", "server version", ...
  std::string detail;  // what was found, and what to do about a problem
};

const char* doctor_level_name(DoctorCheck::Level level) noexcept;  // "ok", "warning", "failed"

}  // namespace gpulock
