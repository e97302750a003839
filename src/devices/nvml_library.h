// nvml::Library: NVML loaded at run time with dlopen(), with typed, version-tolerant queries.
//
// gpulock must start on machines without an NVIDIA driver, and must work with drivers of many
// ages, so it never links against libnvidia-ml. The constructor dlopen()s the library, looks each
// entry point up by name (newest version first, falling back to older names), and calls nvmlInit
// once; the destructor calls nvmlShutdown (NVML counts initialisations, so several Library
// objects may coexist) and dlclose().
//
// Entry points gpulock cannot work without (init, count, handle by index, UUID) must exist, or
// the constructor throws Error(kEnvironment) naming the library and the symbol. Every other
// entry point is optional: its query answers NVML_ERROR_FUNCTION_NOT_FOUND and the caller leaves
// the field it would have filled unset.
//
// Not thread-safe. REQUIRES: external synchronization (NvmlDeviceSource holds a mutex).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "devices/nvml_api.h"

namespace gpulock::nvml {

// The outcome of one query: the NVML return code and, when it is NVML_SUCCESS, the value.
template <typename T>
struct Result {
  nvmlReturn_t code = NVML_ERROR_UNINITIALIZED;
  T value{};

  bool ok() const { return code == NVML_SUCCESS; }
  std::optional<T> get() const { return ok() ? std::optional<T>(value) : std::nullopt; }
};

struct MemoryInfo {
  std::uint64_t total = 0;
  std::uint64_t used = 0;
  std::uint64_t free = 0;
};

// One compute process as the driver reported it; the instance ids are unset when MIG is off or
// the driver's struct has no such fields (v1).
struct ProcessEntry {
  std::uint32_t pid = 0;
  std::optional<std::uint64_t> used_memory_bytes;
  std::optional<unsigned> gpu_instance_id;
  std::optional<unsigned> compute_instance_id;
};

class Library {
 public:
  // Loads `path` (a file name searched like any dlopen() argument, or a path) and initialises
  // NVML. Throws Error(kEnvironment) when the library cannot be loaded, lacks a required entry
  // point, or nvmlInit fails; the message says which and what to do.
  explicit Library(const std::string& path);
  ~Library();

  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  const std::string& path() const { return path_; }

  // "Driver Not Loaded (NVML error 9)": nvmlErrorString when present, and the code.
  std::string error_string(nvmlReturn_t code) const;

  // The names of the entry points that were found, in lookup order (for diagnostics and tests).
  const std::vector<std::string>& bound_symbols() const { return bound_; }

  // --- System -------------------------------------------------------------------------------
  Result<std::string> driver_version() const;  // e.g. "550.54.15"
  Result<std::string> nvml_version() const;    // e.g. "12.550.54"

  // --- Enumeration (required entry points) --------------------------------------------------
  Result<unsigned> device_count() const;
  Result<nvmlDevice_t> device_handle(unsigned index) const;
  Result<std::string> uuid(nvmlDevice_t device) const;  // "GPU-…" or "MIG-…"

  // --- Optional per-device queries ----------------------------------------------------------
  Result<std::string> name(nvmlDevice_t device) const;
  // The PCI bus id in the 8-digit-domain form "00000000:3B:00.0", whichever entry point served.
  Result<std::string> pci_bus_id(nvmlDevice_t device) const;
  Result<MemoryInfo> memory(nvmlDevice_t device) const;
  Result<unsigned> gpu_utilization(nvmlDevice_t device) const;  // percent
  Result<unsigned> power_usage_mw(nvmlDevice_t device) const;
  // nvmlDeviceGetEnforcedPowerLimit, or nvmlDeviceGetPowerManagementLimit where that is missing
  // or fails.
  Result<unsigned> power_limit_mw(nvmlDevice_t device) const;
  Result<nvmlComputeMode_t> compute_mode(nvmlDevice_t device) const;
  Result<bool> mig_enabled(nvmlDevice_t device) const;  // the current (not pending) mode
  Result<unsigned> max_mig_device_count(nvmlDevice_t device) const;
  // NVML_ERROR_NOT_FOUND for an index with no MIG device behind it (indices may have holes).
  Result<nvmlDevice_t> mig_device_handle(nvmlDevice_t device, unsigned index) const;
  Result<unsigned> gpu_instance_id(nvmlDevice_t mig_device) const;
  Result<unsigned> compute_instance_id(nvmlDevice_t mig_device) const;
  // Compute processes only (graphics-only processes are not listed). Works on GPU handles and,
  // where the driver allows it, on MIG device handles.
  Result<std::vector<ProcessEntry>> compute_processes(nvmlDevice_t device) const;
  Result<nvmlGpuTopologyLevel_t> topology_common_ancestor(nvmlDevice_t a, nvmlDevice_t b) const;
  Result<bool> nvlink_active(nvmlDevice_t device, unsigned link) const;
  Result<std::string> nvlink_remote_bus_id(nvmlDevice_t device, unsigned link) const;

 private:
  // An entry point found under one of its names. `variant` says which layout it uses where
  // that differs between names (see the .cc).
  template <typename Fn>
  struct Bound {
    Fn fn = nullptr;
    int variant = 0;
  };

  void* lookup(const char* name);
  template <typename Fn>
  Fn optional_symbol(const char* name);
  template <typename Fn>
  Fn required_symbol(std::initializer_list<const char*> names);
  void bind_symbols();

  std::string path_;
  void* handle_ = nullptr;
  std::vector<std::string> bound_;

  nvmlInit_fn init_ = nullptr;
  nvmlShutdown_fn shutdown_ = nullptr;
  nvmlErrorString_fn error_string_ = nullptr;
  nvmlSystemGetString_fn driver_version_ = nullptr;
  nvmlSystemGetString_fn nvml_version_ = nullptr;
  nvmlDeviceGetCount_fn device_count_ = nullptr;
  nvmlDeviceGetHandleByIndex_fn handle_by_index_ = nullptr;
  nvmlDeviceGetString_fn uuid_ = nullptr;
  nvmlDeviceGetString_fn name_ = nullptr;
  std::vector<Bound<nvmlDeviceGetPciInfo_fn>> pci_info_;  // newest first
  nvmlDeviceGetMemoryInfo_v2_fn memory_v2_ = nullptr;
  nvmlDeviceGetMemoryInfo_fn memory_v1_ = nullptr;
  nvmlDeviceGetUtilizationRates_fn utilization_ = nullptr;
  nvmlDeviceGetUnsigned_fn power_usage_ = nullptr;
  nvmlDeviceGetUnsigned_fn enforced_power_limit_ = nullptr;
  nvmlDeviceGetUnsigned_fn power_management_limit_ = nullptr;
  nvmlDeviceGetComputeMode_fn compute_mode_ = nullptr;
  nvmlDeviceGetMigMode_fn mig_mode_ = nullptr;
  nvmlDeviceGetUnsigned_fn max_mig_device_count_ = nullptr;
  nvmlDeviceGetMigDeviceHandleByIndex_fn mig_handle_by_index_ = nullptr;
  nvmlDeviceGetUnsigned_fn gpu_instance_id_ = nullptr;
  nvmlDeviceGetUnsigned_fn compute_instance_id_ = nullptr;
  std::vector<Bound<nvmlDeviceGetComputeRunningProcesses_fn>> processes_;  // newest first
  nvmlDeviceGetTopologyCommonAncestor_fn topology_ = nullptr;
  nvmlDeviceGetNvLinkState_fn nvlink_state_ = nullptr;
  nvmlDeviceGetNvLinkRemotePciInfo_fn nvlink_remote_pci_ = nullptr;
};

}  // namespace gpulock::nvml
