// Device helpers: names of compute modes and the index shown to people.
#include "gpulock/device.hpp"

#include <string>

namespace gpulock {

const char* compute_mode_name(ComputeMode mode) noexcept {
  switch (mode) {
    case ComputeMode::kDefault:
      return "default";
    case ComputeMode::kExclusiveThread:
      return "exclusive_thread";
    case ComputeMode::kProhibited:
      return "prohibited";
    case ComputeMode::kExclusiveProcess:
      return "exclusive_process";
    case ComputeMode::kUnknown:
      break;
  }
  return "unknown";
}

std::string Device::display_index() const {
  std::string text = std::to_string(index);
  if (mig_index) {
    text += ':';
    text += std::to_string(*mig_index);
  }
  return text;
}

}  // namespace gpulock
