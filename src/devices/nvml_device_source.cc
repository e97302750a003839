// NvmlDeviceSource: the DeviceSource of real machines, reading GPUs from the NVIDIA driver.
//
// Every query goes through nvml::Library, under one mutex (NVML handles are shared state), and
// with every signal blocked: threads the driver starts take none (see util/signals_blocked.h).
// Fields the driver will not give (NOT_SUPPORTED, NO_PERMISSION, an entry point missing from an
// old driver, ...) are left unset; only a failure to enumerate GPUs at all throws. A GPU whose
// handle or UUID cannot be read is skipped: without a UUID it cannot be locked.
//
// MIG: a GPU with MIG mode on is listed, followed by one Device per MIG device (compute
// instance) with its own MIG-… UUID. Power is board-wide and is not split between instances.
// Each instance's processes come from querying its MIG handle; where the driver refuses that
// (it is not supported under vGPU, for one), they are taken from the GPU's list by matching
// gpuInstanceId (and computeInstanceId when known); where even the instance ids are unknown,
// the instance is given all of the GPU's processes, so a busy GPU never looks idle.
#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "devices/nvml_library.h"
#include "gpulock/device_source.hpp"
#include "gpulock/error.hpp"
#include "util/signals_blocked.h"

namespace gpulock {
namespace {

using nvml::nvmlDevice_t;
using nvml::ProcessEntry;

// How long a GPU's MIG mode, once read, is used before it is read again. nvmlDeviceGetMigMode is
// the one query of a look at a GPU that the driver does not answer from memory: 0.27-0.29 ms a
// GPU every time on an H100 (docs/operations.md), two thirds of the whole look, which a waiter
// makes at every plan. The mode changes only when an administrator switches it and resets the
// GPU, so a second-old reading loses nothing.
constexpr std::chrono::seconds kMigModeLifetime{1};

constexpr int kSameBoard = 0;
constexpr int kUnknownDistance = 50;  // NVML_TOPOLOGY_SYSTEM: assume the worst

ComputeMode to_compute_mode(nvml::nvmlComputeMode_t mode) {
  switch (mode) {
    case nvml::NVML_COMPUTEMODE_DEFAULT:
      return ComputeMode::kDefault;
    case nvml::NVML_COMPUTEMODE_EXCLUSIVE_THREAD:
      return ComputeMode::kExclusiveThread;
    case nvml::NVML_COMPUTEMODE_PROHIBITED:
      return ComputeMode::kProhibited;
    case nvml::NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
      return ComputeMode::kExclusiveProcess;
  }
  return ComputeMode::kUnknown;
}

std::vector<GpuProcess> to_processes(const std::vector<ProcessEntry>& entries) {
  std::vector<GpuProcess> processes;
  processes.reserve(entries.size());
  for (const ProcessEntry& entry : entries)
    processes.push_back(GpuProcess{entry.pid, entry.used_memory_bytes});
  return processes;
}

std::string describe(const nvml::Library& library) {
  const SignalsBlocked for_driver_threads;
  const auto driver = library.driver_version();
  const auto version = library.nvml_version();
  if (driver.ok() && version.ok())
    return fmt::format("NVML (driver {}, NVML {})", driver.value, version.value);
  if (driver.ok()) return fmt::format("NVML (driver {})", driver.value);
  if (version.ok()) return fmt::format("NVML {}", version.value);
  return "NVML";
}

class NvmlDeviceSource final : public DeviceSource {
 public:
  explicit NvmlDeviceSource(const std::string& library_path)
      : library_(library_path), description_(describe(library_)) {}

  std::vector<Device> devices() override {
    std::lock_guard<std::mutex> lock(mutex_);
    const SignalsBlocked for_driver_threads;  // threads the driver starts now take no signal
    return read_devices_locked(/*details=*/true);
  }

  int distance(const std::string& uuid_a, const std::string& uuid_b) override;

  std::string description() const override { return description_; }
  bool simulated() const override { return false; }

 private:
  // What distance() needs about a whole GPU; refreshed by every enumeration.
  struct GpuPlace {
    unsigned index = 0;
    std::string bus_id;
  };

  // Enumerates every GPU and MIG instance and refreshes parent_of_ and gpus_. With `details`
  // false only identities are read (for distance() meeting an unknown UUID).
  std::vector<Device> read_devices_locked(bool details);
  void read_details_locked(nvmlDevice_t handle, Device* gpu, std::vector<ProcessEntry>* raw);
  void append_mig_instances_locked(nvmlDevice_t gpu_handle, const Device& gpu,
                                   const std::vector<ProcessEntry>& gpu_processes, bool details,
                                   std::vector<Device>* out);
  // Sets *known to false when neither the instance nor its GPU could list processes.
  std::vector<GpuProcess> mig_processes_locked(nvmlDevice_t mig_handle,
                                               const std::vector<ProcessEntry>& gpu_processes,
                                               bool gpu_known, bool* known);
  // The GPU's MIG mode, read again only when the last reading is kMigModeLifetime old.
  nvml::Result<bool> mig_mode_locked(nvmlDevice_t handle, const std::string& uuid);
  int gpu_distance_locked(const GpuPlace& a, const GpuPlace& b);
  bool nvlink_reaches_locked(nvmlDevice_t from, const std::string& to_bus_id);

  std::mutex mutex_;
  nvml::Library library_;  // GUARDED_BY(mutex_), as is every member below description_
  const std::string description_;
  std::map<std::string, std::string> parent_of_;  // any device UUID -> its GPU's UUID
  std::map<std::string, GpuPlace> gpus_;          // GPU UUID -> where it is
  std::map<std::pair<std::string, std::string>, int> distances_;  // by ordered GPU UUID pair
  struct MigModeReading {
    nvml::Result<bool> mode;
    std::chrono::steady_clock::time_point read_at;
  };
  std::map<std::string, MigModeReading> mig_modes_;  // by GPU UUID
};

nvml::Result<bool> NvmlDeviceSource::mig_mode_locked(nvmlDevice_t handle, const std::string& uuid) {
  const auto now = std::chrono::steady_clock::now();
  const auto known = mig_modes_.find(uuid);
  if (known != mig_modes_.end() && now - known->second.read_at < kMigModeLifetime)
    return known->second.mode;
  const nvml::Result<bool> mode = library_.mig_enabled(handle);
  mig_modes_[uuid] = MigModeReading{mode, now};
  return mode;
}

std::vector<Device> NvmlDeviceSource::read_devices_locked(bool details) {
  const auto count = library_.device_count();
  if (!count.ok()) {
    throw Error(ErrorCode::kEnvironment,
                fmt::format("NVML ('{}') could not count the GPUs: {}", library_.path(),
                            library_.error_string(count.code)));
  }
  parent_of_.clear();
  gpus_.clear();
  std::vector<Device> devices;
  for (unsigned index = 0; index < count.value; ++index) {
    const auto handle = library_.device_handle(index);
    if (!handle.ok()) continue;
    auto uuid = library_.uuid(handle.value);
    if (!uuid.ok() || uuid.value.empty()) continue;

    Device gpu;
    gpu.index = index;
    gpu.uuid = std::move(uuid.value);
    if (auto bus = library_.pci_bus_id(handle.value); bus.ok()) gpu.pci_bus_id = bus.value;
    std::vector<ProcessEntry> raw_processes;
    if (details) read_details_locked(handle.value, &gpu, &raw_processes);
    const auto mig = mig_mode_locked(handle.value, gpu.uuid);
    if (mig.ok()) gpu.mig_enabled = mig.value;

    parent_of_[gpu.uuid] = gpu.uuid;
    gpus_[gpu.uuid] = GpuPlace{index, gpu.pci_bus_id};
    devices.push_back(gpu);
    if (mig.ok() && mig.value)
      append_mig_instances_locked(handle.value, gpu, raw_processes, details, &devices);
  }
  return devices;
}

void NvmlDeviceSource::read_details_locked(nvmlDevice_t handle, Device* gpu,
                                           std::vector<ProcessEntry>* raw) {
  if (auto name = library_.name(handle); name.ok()) gpu->name = name.value;
  if (auto memory = library_.memory(handle); memory.ok()) {
    gpu->memory_total_bytes = memory.value.total;
    gpu->memory_used_bytes = memory.value.used;
    gpu->memory_free_bytes = memory.value.free;
  }
  gpu->utilization_percent = library_.gpu_utilization(handle).get();
  if (auto draw = library_.power_usage_mw(handle); draw.ok())
    gpu->power_draw_watts = draw.value / 1000.0;
  if (auto limit = library_.power_limit_mw(handle); limit.ok())
    gpu->power_limit_watts = limit.value / 1000.0;
  if (auto mode = library_.compute_mode(handle); mode.ok())
    gpu->compute_mode = to_compute_mode(mode.value);
  if (auto processes = library_.compute_processes(handle); processes.ok()) {
    gpu->processes = to_processes(processes.value);
    *raw = std::move(processes.value);
  } else {
    gpu->processes_known = false;
  }
}

void NvmlDeviceSource::append_mig_instances_locked(nvmlDevice_t gpu_handle, const Device& gpu,
                                                   const std::vector<ProcessEntry>& gpu_processes,
                                                   bool details, std::vector<Device>* out) {
  const auto slots = library_.max_mig_device_count(gpu_handle);
  if (!slots.ok()) return;
  unsigned position = 0;
  for (unsigned slot = 0; slot < slots.value; ++slot) {
    // Slots without a MIG device answer NOT_FOUND; they are holes, not the end of the list.
    const auto handle = library_.mig_device_handle(gpu_handle, slot);
    if (!handle.ok()) continue;
    auto uuid = library_.uuid(handle.value);
    if (!uuid.ok() || uuid.value.empty()) continue;

    Device instance;
    instance.index = gpu.index;
    instance.mig_index = position++;
    instance.uuid = std::move(uuid.value);
    instance.parent_uuid = gpu.uuid;
    instance.pci_bus_id = gpu.pci_bus_id;
    if (details) {
      const auto name = library_.name(handle.value);
      instance.name = name.ok() ? name.value : gpu.name;
      if (auto memory = library_.memory(handle.value); memory.ok()) {
        instance.memory_total_bytes = memory.value.total;
        instance.memory_used_bytes = memory.value.used;
        instance.memory_free_bytes = memory.value.free;
      }
      instance.utilization_percent = library_.gpu_utilization(handle.value).get();
      if (auto mode = library_.compute_mode(handle.value); mode.ok())
        instance.compute_mode = to_compute_mode(mode.value);
      instance.processes = mig_processes_locked(handle.value, gpu_processes, gpu.processes_known,
                                                &instance.processes_known);
    }
    parent_of_[instance.uuid] = gpu.uuid;
    out->push_back(std::move(instance));
  }
}

std::vector<GpuProcess> NvmlDeviceSource::mig_processes_locked(
    nvmlDevice_t mig_handle, const std::vector<ProcessEntry>& gpu_processes, bool gpu_known,
    bool* known) {
  *known = true;
  if (auto own = library_.compute_processes(mig_handle); own.ok()) return to_processes(own.value);
  *known = gpu_known;  // from here on, only as good as the GPU's own list
  // The driver will not list this instance's processes: pick them out of the GPU's list.
  const auto gi = library_.gpu_instance_id(mig_handle);
  const auto ci = library_.compute_instance_id(mig_handle);
  if (!gi.ok()) return to_processes(gpu_processes);  // cannot attribute: err on the busy side
  std::vector<ProcessEntry> mine;
  for (const ProcessEntry& process : gpu_processes) {
    if (process.gpu_instance_id != gi.value) continue;
    if (ci.ok() && process.compute_instance_id.has_value() &&
        *process.compute_instance_id != ci.value)
      continue;
    mine.push_back(process);
  }
  return to_processes(mine);
}

int NvmlDeviceSource::distance(const std::string& uuid_a, const std::string& uuid_b) {
  std::lock_guard<std::mutex> lock(mutex_);
  const SignalsBlocked for_driver_threads;
  if (uuid_a == uuid_b) return kSameBoard;
  if (!parent_of_.contains(uuid_a) || !parent_of_.contains(uuid_b)) {
    try {
      read_devices_locked(/*details=*/false);
    } catch (const Error&) {
      return kUnknownDistance;  // distance() answers "unknown" rather than failing
    }
  }
  const auto parent_a = parent_of_.find(uuid_a);
  const auto parent_b = parent_of_.find(uuid_b);
  if (parent_a == parent_of_.end() || parent_b == parent_of_.end()) return kUnknownDistance;
  const std::string& gpu_a = parent_a->second;
  const std::string& gpu_b = parent_b->second;
  if (gpu_a == gpu_b) return kSameBoard;  // MIG instances of one GPU, or one and its GPU

  const auto key = std::minmax(gpu_a, gpu_b);
  const auto pair = std::make_pair(key.first, key.second);
  if (const auto cached = distances_.find(pair); cached != distances_.end()) return cached->second;
  const int result = gpu_distance_locked(gpus_.at(gpu_a), gpus_.at(gpu_b));
  distances_.emplace(pair, result);
  return result;
}

int NvmlDeviceSource::gpu_distance_locked(const GpuPlace& a, const GpuPlace& b) {
  const auto handle_a = library_.device_handle(a.index);
  const auto handle_b = library_.device_handle(b.index);
  if (!handle_a.ok() || !handle_b.ok()) return kUnknownDistance;
  // A direct NVLink both ends agree on beats any PCIe path. (Through an NVSwitch the remote end
  // is the switch, so such GPUs fall through to the PCIe topology.)
  if (nvlink_reaches_locked(handle_a.value, b.bus_id) &&
      nvlink_reaches_locked(handle_b.value, a.bus_id))
    return kSameBoard;
  const auto level = library_.topology_common_ancestor(handle_a.value, handle_b.value);
  if (!level.ok() || level.value < nvml::NVML_TOPOLOGY_INTERNAL ||
      level.value > nvml::NVML_TOPOLOGY_SYSTEM)
    return kUnknownDistance;
  return static_cast<int>(level.value);
}

bool NvmlDeviceSource::nvlink_reaches_locked(nvmlDevice_t from, const std::string& to_bus_id) {
  if (to_bus_id.empty()) return false;
  for (unsigned link = 0; link < nvml::NVML_NVLINK_MAX_LINKS; ++link) {
    const auto active = library_.nvlink_active(from, link);
    if (active.code == nvml::NVML_ERROR_FUNCTION_NOT_FOUND ||
        active.code == nvml::NVML_ERROR_NOT_SUPPORTED)
      return false;                               // no NVLink on this GPU (or driver)
    if (!active.ok() || !active.value) continue;  // e.g. INVALID_ARGUMENT past its last link
    const auto remote = library_.nvlink_remote_bus_id(from, link);
    if (remote.ok() && remote.value == to_bus_id) return true;
  }
  return false;
}

}  // namespace

std::unique_ptr<DeviceSource> make_nvml_source(const std::string& library_path) {
  return std::make_unique<NvmlDeviceSource>(library_path);
}

}  // namespace gpulock
