// The names of the status and doctor enums (include/gpulock/status.hpp, doctor.hpp), for people
// and JSON.
#include "gpulock/doctor.hpp"
#include "gpulock/status.hpp"

namespace gpulock {

const char* gpu_state_name(GpuState state) noexcept {
  switch (state) {
    case GpuState::kFree:
      return "free";
    case GpuState::kLeased:
      return "leased";
    case GpuState::kBusy:
      return "busy";
    case GpuState::kExcluded:
      return "excluded";
  }
  return "free";
}

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

}  // namespace gpulock
