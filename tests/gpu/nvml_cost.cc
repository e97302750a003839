// nvml_cost: what each NVML query gpulock makes costs on this machine's driver, timed through
// gpulock's own nvml::Library (src/devices/nvml_library.h), then a whole DeviceSource::devices()
// (what every gpulock command and every waiter's look at the GPUs reads). For checks by hand on a
// machine with an NVIDIA GPU (tests/gpu/check_real_gpu.py prints it); where no driver is, it says
// so and exits 2.
//
//   nvml_cost [LIBRARY]   default $GPULOCK_NVML_LIBRARY, else libnvidia-ml.so.1; each query twice
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "devices/nvml_library.h"
#include "gpulock/device_source.hpp"
#include "gpulock/error.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Runs `query` twice and prints both times with its NVML return code.
template <typename Query>
void time_twice(const char* what, Query&& query) {
  double times[2];
  int code = 0;
  for (double& t : times) {
    const auto start = Clock::now();
    code = static_cast<int>(query().code);
    t = ms_since(start);
  }
  std::printf("  %-28s %8.3f ms, then %8.3f ms (NVML code %d)\n", what, times[0], times[1], code);
}

}  // namespace

int main(int argc, char** argv) {
  const char* configured = std::getenv("GPULOCK_NVML_LIBRARY");
  const std::string path = argc > 1                               ? argv[1]
                           : configured != nullptr && *configured ? configured
                                                                  : "libnvidia-ml.so.1";
  try {
    auto start = Clock::now();
    gpulock::nvml::Library nvml(path);
    std::printf("load + nvmlInit                %8.3f ms\n", ms_since(start));
    const auto count = nvml.device_count();
    for (unsigned i = 0; count.ok() && i < count.value; ++i) {
      std::printf("GPU %u\n", i);
      time_twice("nvmlDeviceGetHandleByIndex", [&] { return nvml.device_handle(i); });
      const auto handle = nvml.device_handle(i).value;
      time_twice("uuid", [&] { return nvml.uuid(handle); });
      time_twice("name", [&] { return nvml.name(handle); });
      time_twice("pci bus id", [&] { return nvml.pci_bus_id(handle); });
      time_twice("memory", [&] { return nvml.memory(handle); });
      time_twice("utilization", [&] { return nvml.gpu_utilization(handle); });
      time_twice("power usage", [&] { return nvml.power_usage_mw(handle); });
      time_twice("power limit", [&] { return nvml.power_limit_mw(handle); });
      time_twice("compute mode", [&] { return nvml.compute_mode(handle); });
      time_twice("MIG mode", [&] { return nvml.mig_enabled(handle); });
      time_twice("compute processes", [&] { return nvml.compute_processes(handle); });
    }
    start = Clock::now();
    auto source = gpulock::make_nvml_source(path);
    std::printf("make_nvml_source               %8.3f ms\n", ms_since(start));
    for (int round = 1; round <= 3; ++round) {
      start = Clock::now();
      const auto devices = source->devices();
      std::printf("devices() #%d (%zu devices)     %8.3f ms\n", round, devices.size(),
                  ms_since(start));
    }
  } catch (const gpulock::Error& error) {
    std::fprintf(stderr, "nvml_cost: %s\n", error.what());
    return 2;
  }
  return 0;
}
