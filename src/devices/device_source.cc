// open_device_source(): chooses simulated GPUs or NVML from the environment.
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "gpulock/device_source.hpp"
#include "gpulock/error.hpp"
#include "util/strings.h"

namespace gpulock {

std::unique_ptr<DeviceSource> open_device_source() {
  if (const char* fake = std::getenv("GPULOCK_FAKE_GPUS"); fake != nullptr && *fake != '\0') {
    const std::string value(trim(fake));
    if (value.find('/') != std::string::npos || value.ends_with(".json"))
      return make_simulated_source_from_file(value);
    unsigned count = 0;
    try {
      std::size_t used = 0;
      const unsigned long parsed = std::stoul(value, &used);
      if (used != value.size() || parsed > 1024) throw std::out_of_range("count");
      count = static_cast<unsigned>(parsed);
    } catch (const std::exception&) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("GPULOCK_FAKE_GPUS='{}' is neither a GPU count (0-1024) nor a path "
                              "to a JSON file (docs/simulated-gpus.md)",
                              sanitize_for_display(value, 64)));
    }
    return make_simulated_source(count);
  }
  const char* library = std::getenv("GPULOCK_NVML_LIBRARY");
  return make_nvml_source(library != nullptr && *library != '\0' ? library : "libnvidia-ml.so.1");
}

}  // namespace gpulock
