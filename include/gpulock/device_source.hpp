// DeviceSource: where GPUs come from. NVML on real machines, simulated devices for tests/demos.
//
// open_device_source() picks one from the environment:
//   GPULOCK_FAKE_GPUS=N            N idle simulated GPUs (80 GiB each, stable UUIDs)
//   GPULOCK_FAKE_GPUS=/path.json   simulated GPUs described by a file (docs/simulated-gpus.md)
//   otherwise                      NVML, loaded at run time from GPULOCK_NVML_LIBRARY or
//                                  libnvidia-ml.so.1
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpulock/device.hpp"

namespace gpulock {

class DeviceSource {
 public:
  virtual ~DeviceSource() = default;

  // A fresh snapshot of every device, in index order (MIG instances follow their GPU; a GPU
  // with MIG enabled is listed too, with mig_enabled set). Throws Error on failure.
  virtual std::vector<Device> devices() = 0;

  // How far apart two devices are, by their UUIDs: 0 = same board, 10 = one PCIe switch,
  // 20 = several switches, 30 = same host bridge, 40 = same NUMA node, 50 = across sockets
  // (NVML's topology levels). NVLink-connected GPUs count as 0. Unknown: 50.
  virtual int distance(const std::string& uuid_a, const std::string& uuid_b) = 0;

  // One line for people: "NVML (driver 550.54.15, NVML 12.550.54)" or "4 simulated GPUs".
  virtual std::string description() const = 0;

  // True for simulated devices; the CLI says so whenever it shows or leases them.
  virtual bool simulated() const = 0;
};

// The source the environment asks for (see above). Throws Error(kEnvironment) with advice when
// neither simulated GPUs are configured nor NVML can be loaded.
std::unique_ptr<DeviceSource> open_device_source();

// Explicit constructors, for tests and embedding.
std::unique_ptr<DeviceSource> make_simulated_source(unsigned count);
std::unique_ptr<DeviceSource> make_simulated_source_from_file(const std::string& path);
std::unique_ptr<DeviceSource> make_nvml_source(const std::string& library_path);

}  // namespace gpulock
