// Device: what gpulock knows about one GPU (or one MIG instance) at one moment.
//
// Filled in by a DeviceSource (NVML or simulated). Fields a source cannot read are left empty
// (std::nullopt) rather than guessed, so health filters can tell "unknown" from "zero".
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpulock {

// A compute process running on a device, as the driver reports it.
struct GpuProcess {
  std::uint32_t pid = 0;  // as the driver sees it (host PID namespace under containers)
  std::optional<std::uint64_t> used_memory_bytes;
};

enum class ComputeMode { kUnknown, kDefault, kExclusiveThread, kProhibited, kExclusiveProcess };

const char* compute_mode_name(ComputeMode mode) noexcept;  // "default", "exclusive_process", ...

struct Device {
  // Position in NVML order (PCI bus order). For a MIG instance: its parent's index.
  unsigned index = 0;
  // For a MIG instance, its position among its parent's instances; unset for a whole GPU.
  std::optional<unsigned> mig_index;
  std::string uuid;         // "GPU-…" or "MIG-…": the key of every lock
  std::string name;         // e.g. "NVIDIA H100 80GB HBM3"
  std::string pci_bus_id;   // e.g. "00000000:3B:00.0"; for MIG, the parent's
  std::string parent_uuid;  // for a MIG instance, the UUID of its GPU; else empty

  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<std::uint64_t> memory_used_bytes;
  std::optional<std::uint64_t> memory_free_bytes;
  std::optional<unsigned> utilization_percent;  // GPU (SM) utilisation over the driver's window
  // Since when utilisation has been 0 %, where the source itself knows (simulated GPUs'
  // `idle_since`); unset for NVML, whose readings the IdleTracker (gpulock/monitor.hpp) follows
  // over time instead.
  std::optional<std::chrono::system_clock::time_point> idle_since;
  std::optional<double> power_draw_watts;
  std::optional<double> power_limit_watts;
  ComputeMode compute_mode = ComputeMode::kUnknown;
  std::optional<bool> mig_enabled;  // current MIG mode of a whole GPU; unset for MIG instances

  std::vector<GpuProcess> processes;  // compute processes only (graphics-only ones excluded)
  // False when the driver would not list processes (e.g. no permission): then `processes` is
  // empty but proves nothing, and the GPU does not pass the "no foreign processes" check.
  bool processes_known = true;

  bool is_mig_instance() const { return mig_index.has_value(); }
  // "0", or "0:1" for MIG instance 1 of GPU 0: how gpulock shows a device to people.
  std::string display_index() const;
};

}  // namespace gpulock
