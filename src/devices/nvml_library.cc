// nvml::Library: dlopen() of NVML, symbol lookup with fallbacks, and typed queries.
#include "devices/nvml_library.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "util/signals_blocked.h"

namespace gpulock::nvml {
namespace {

// Process lists: the buffer is pre-filled with this byte so we can see how far the driver wrote.
constexpr unsigned char kSentinel = 0xAA;
constexpr std::size_t kStrideV1 = sizeof(nvmlProcessInfo_v1_t);  // 16
constexpr std::size_t kStrideV2 = sizeof(nvmlProcessInfo_v2_t);  // 24
constexpr std::size_t kStrideV3 = sizeof(nvmlProcessInfo_v3_t);  // 32
constexpr std::size_t kMaxStride = kStrideV3;
// Bounds for the "list grew while we asked" retry loop.
constexpr int kMaxProcessAttempts = 8;
constexpr unsigned kMaxProcesses = 1U << 16;

// Answers that mean "this entry point cannot serve the request; an older one may".
bool try_older(nvmlReturn_t code) {
  return code == NVML_ERROR_FUNCTION_NOT_FOUND || code == NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}

// A NUL-terminated copy of a fixed-size char field, even if the driver filled it completely.
std::string from_field(const char* field, std::size_t size) {
  return std::string(field, strnlen(field, size));
}

// "0000:3b:00.0" -> "00000000:3B:00.0": the form NVML's busId and nvidia-smi use. Anything that
// does not look like a bus id is returned upper-cased and otherwise untouched.
std::string normalize_bus_id(std::string id) {
  for (char& c : id) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const auto colon = id.find(':');
  if (colon != std::string::npos && colon < 8 && std::count(id.begin(), id.end(), ':') == 2)
    id.insert(0, 8 - colon, '0');
  return id;
}

// How many bytes each entry took: the driver's struct may not be the one its symbol suggests
// (nvitop PR#79: R535 wrote 32-byte entries from _v3; nvitop PR#226: an R550 build wrote 16-byte
// entries from _v3). Each layout ends in a field whose top byte is never the sentinel (a memory
// size or an instance id), so `written` is count * stride. When that is inconclusive we keep the
// layout the symbol is documented to use.
std::size_t detect_stride(const std::vector<unsigned char>& buffer, unsigned count,
                          std::size_t expected) {
  std::size_t written = buffer.size();
  while (written > 0 && buffer[written - 1] == kSentinel) --written;
  if (count == 0 || written == 0) return expected;
  constexpr std::size_t kCandidates[] = {kStrideV1, kStrideV2, kStrideV3};
  for (std::size_t stride : kCandidates)
    if (count * stride == written) return stride;
  if (count * expected >= written) return expected;
  for (std::size_t stride : kCandidates)
    if (count * stride >= written) return stride;
  return expected;
}

ProcessEntry parse_process(const unsigned char* entry, std::size_t stride) {
  ProcessEntry process;
  std::uint32_t pid = 0;
  std::uint64_t used = 0;
  std::memcpy(&pid, entry + offsetof(nvmlProcessInfo_v2_t, pid), sizeof pid);
  std::memcpy(&used, entry + offsetof(nvmlProcessInfo_v2_t, usedGpuMemory), sizeof used);
  process.pid = pid;
  if (used != NVML_VALUE_NOT_AVAILABLE) process.used_memory_bytes = used;
  if (stride >= kStrideV2) {
    std::uint32_t gi = 0;
    std::uint32_t ci = 0;
    std::memcpy(&gi, entry + offsetof(nvmlProcessInfo_v2_t, gpuInstanceId), sizeof gi);
    std::memcpy(&ci, entry + offsetof(nvmlProcessInfo_v2_t, computeInstanceId), sizeof ci);
    if (gi != NVML_INSTANCE_ID_NONE) process.gpu_instance_id = gi;
    if (ci != NVML_INSTANCE_ID_NONE) process.compute_instance_id = ci;
  }
  return process;
}

// One entry point's process list: ask for the count, then fetch with a buffer sized for the
// largest known layout, retrying (a bounded number of times) while the list keeps growing.
Result<std::vector<ProcessEntry>> query_processes(nvmlDeviceGetComputeRunningProcesses_fn fn,
                                                  std::size_t expected_stride,
                                                  nvmlDevice_t device) {
  Result<std::vector<ProcessEntry>> result;
  unsigned needed = 0;
  result.code = fn(device, &needed, nullptr);
  if (result.code == NVML_SUCCESS && needed == 0) return result;
  if (result.code != NVML_SUCCESS && result.code != NVML_ERROR_INSUFFICIENT_SIZE) return result;
  for (int attempt = 0; attempt < kMaxProcessAttempts; ++attempt) {
    needed = std::max(needed, 1U);
    if (needed > kMaxProcesses) break;
    // Exactly `needed` entries: a driver that clears the whole buffer then still lets
    // detect_stride() see count * stride bytes written.
    std::vector<unsigned char> buffer(std::size_t{needed} * kMaxStride, kSentinel);
    unsigned count = needed;
    result.code = fn(device, &count, buffer.data());
    if (result.code == NVML_ERROR_INSUFFICIENT_SIZE) {
      needed = count > needed ? count : needed * 2;
      continue;
    }
    if (!result.ok()) return result;
    count = std::min(count, needed);  // never read past what we handed over
    const std::size_t stride = detect_stride(buffer, count, expected_stride);
    result.value.reserve(count);
    for (unsigned i = 0; i < count; ++i)
      result.value.push_back(parse_process(buffer.data() + std::size_t{i} * stride, stride));
    return result;
  }
  result.code = NVML_ERROR_INSUFFICIENT_SIZE;
  result.value.clear();
  return result;
}

template <typename T>
Result<T> not_found() {
  Result<T> result;
  result.code = NVML_ERROR_FUNCTION_NOT_FOUND;
  return result;
}

Result<std::string> read_string(nvmlReturn_t (*fn)(char*, unsigned), unsigned size) {
  if (fn == nullptr) return not_found<std::string>();
  std::vector<char> buffer(size, '\0');
  Result<std::string> result;
  result.code = fn(buffer.data(), size);
  if (result.ok()) result.value = from_field(buffer.data(), size);
  return result;
}

Result<std::string> read_device_string(nvmlDeviceGetString_fn fn, nvmlDevice_t device,
                                       unsigned size) {
  if (fn == nullptr) return not_found<std::string>();
  std::vector<char> buffer(size, '\0');
  Result<std::string> result;
  result.code = fn(device, buffer.data(), size);
  if (result.ok()) result.value = from_field(buffer.data(), size);
  return result;
}

Result<unsigned> read_unsigned(nvmlDeviceGetUnsigned_fn fn, nvmlDevice_t device) {
  if (fn == nullptr) return not_found<unsigned>();
  Result<unsigned> result;
  result.code = fn(device, &result.value);
  return result;
}

}  // namespace

Library::Library(const std::string& path) : path_(path) {
  // The driver starts threads of its own (nvmlInit does, with driver 580): they must take none
  // of the signals the program blocks to read from a signalfd (util/signals_blocked.h).
  const SignalsBlocked for_driver_threads;
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    throw Error(ErrorCode::kEnvironment,
                fmt::format("could not load the NVIDIA driver library (NVML) '{}': {}. Install "
                            "the NVIDIA driver, or set GPULOCK_NVML_LIBRARY to the path of its "
                            "libnvidia-ml.so.1; to use N simulated GPUs instead, set "
                            "GPULOCK_FAKE_GPUS=N",
                            path, why != nullptr ? why : "unknown error"));
  }
  try {
    bind_symbols();
    const nvmlReturn_t code = init_();
    if (code != NVML_SUCCESS) {
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("NVML ('{}') failed to initialise: {}. Is the NVIDIA kernel driver "
                              "loaded (does nvidia-smi work)? To use N simulated GPUs instead, set "
                              "GPULOCK_FAKE_GPUS=N",
                              path, error_string(code)));
    }
  } catch (...) {
    dlclose(handle_);
    throw;
  }
}

Library::~Library() {
  const SignalsBlocked for_driver_threads;
  if (shutdown_ != nullptr) shutdown_();
  dlclose(handle_);
}

void* Library::lookup(const char* name) {
  void* symbol = dlsym(handle_, name);
  if (symbol != nullptr) bound_.emplace_back(name);
  return symbol;
}

template <typename Fn>
Fn Library::optional_symbol(const char* name) {
  return reinterpret_cast<Fn>(lookup(name));
}

template <typename Fn>
Fn Library::required_symbol(std::initializer_list<const char*> names) {
  std::string wanted;
  for (const char* name : names) {
    if (void* symbol = lookup(name)) return reinterpret_cast<Fn>(symbol);
    wanted += wanted.empty() ? name : fmt::format(" (or {})", name);
  }
  throw Error(ErrorCode::kEnvironment,
              fmt::format("'{}' is not a usable NVML library: it lacks the entry point {}. Is it "
                          "the libnvidia-ml.so.1 of an NVIDIA driver (GPULOCK_NVML_LIBRARY)?",
                          path_, wanted));
}

void Library::bind_symbols() {
  init_ = required_symbol<nvmlInit_fn>({"nvmlInit_v2", "nvmlInit"});
  device_count_ =
      required_symbol<nvmlDeviceGetCount_fn>({"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
  handle_by_index_ = required_symbol<nvmlDeviceGetHandleByIndex_fn>(
      {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  uuid_ = required_symbol<nvmlDeviceGetString_fn>({"nvmlDeviceGetUUID"});

  shutdown_ = optional_symbol<nvmlShutdown_fn>("nvmlShutdown");
  error_string_ = optional_symbol<nvmlErrorString_fn>("nvmlErrorString");
  driver_version_ = optional_symbol<nvmlSystemGetString_fn>("nvmlSystemGetDriverVersion");
  nvml_version_ = optional_symbol<nvmlSystemGetString_fn>("nvmlSystemGetNVMLVersion");
  name_ = optional_symbol<nvmlDeviceGetString_fn>("nvmlDeviceGetName");

  // PCI info: variant = version; only _v3 is documented to fill the 32-byte busId.
  const std::pair<const char*, int> pci_names[] = {
      {"nvmlDeviceGetPciInfo_v3", 3}, {"nvmlDeviceGetPciInfo_v2", 2}, {"nvmlDeviceGetPciInfo", 1}};
  for (const auto& [name, version] : pci_names)
    if (auto fn = optional_symbol<nvmlDeviceGetPciInfo_fn>(name))
      pci_info_.push_back({fn, version});

  memory_v2_ = optional_symbol<nvmlDeviceGetMemoryInfo_v2_fn>("nvmlDeviceGetMemoryInfo_v2");
  memory_v1_ = optional_symbol<nvmlDeviceGetMemoryInfo_fn>("nvmlDeviceGetMemoryInfo");
  utilization_ = optional_symbol<nvmlDeviceGetUtilizationRates_fn>("nvmlDeviceGetUtilizationRates");
  power_usage_ = optional_symbol<nvmlDeviceGetUnsigned_fn>("nvmlDeviceGetPowerUsage");
  enforced_power_limit_ =
      optional_symbol<nvmlDeviceGetUnsigned_fn>("nvmlDeviceGetEnforcedPowerLimit");
  power_management_limit_ =
      optional_symbol<nvmlDeviceGetUnsigned_fn>("nvmlDeviceGetPowerManagementLimit");
  compute_mode_ = optional_symbol<nvmlDeviceGetComputeMode_fn>("nvmlDeviceGetComputeMode");
  mig_mode_ = optional_symbol<nvmlDeviceGetMigMode_fn>("nvmlDeviceGetMigMode");
  max_mig_device_count_ =
      optional_symbol<nvmlDeviceGetUnsigned_fn>("nvmlDeviceGetMaxMigDeviceCount");
  mig_handle_by_index_ = optional_symbol<nvmlDeviceGetMigDeviceHandleByIndex_fn>(
      "nvmlDeviceGetMigDeviceHandleByIndex");
  gpu_instance_id_ = optional_symbol<nvmlDeviceGetUnsigned_fn>("nvmlDeviceGetGpuInstanceId");
  compute_instance_id_ =
      optional_symbol<nvmlDeviceGetUnsigned_fn>("nvmlDeviceGetComputeInstanceId");

  // Process lists: variant = the entry size the symbol is documented to use (see nvml_api.h).
  const std::pair<const char*, std::size_t> process_names[] = {
      {"nvmlDeviceGetComputeRunningProcesses_v3", kStrideV2},
      {"nvmlDeviceGetComputeRunningProcesses_v2", kStrideV2},
      {"nvmlDeviceGetComputeRunningProcesses", kStrideV1}};
  for (const auto& [name, stride] : process_names)
    if (auto fn = optional_symbol<nvmlDeviceGetComputeRunningProcesses_fn>(name))
      processes_.push_back({fn, static_cast<int>(stride)});

  topology_ = optional_symbol<nvmlDeviceGetTopologyCommonAncestor_fn>(
      "nvmlDeviceGetTopologyCommonAncestor");
  nvlink_state_ = optional_symbol<nvmlDeviceGetNvLinkState_fn>("nvmlDeviceGetNvLinkState");
  nvlink_remote_pci_ =
      optional_symbol<nvmlDeviceGetNvLinkRemotePciInfo_fn>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
}

std::string Library::error_string(nvmlReturn_t code) const {
  const char* text = error_string_ != nullptr ? error_string_(code) : nullptr;
  if (text == nullptr || *text == '\0') return fmt::format("NVML error {}", static_cast<int>(code));
  return fmt::format("{} (NVML error {})", text, static_cast<int>(code));
}

Result<std::string> Library::driver_version() const {
  return read_string(driver_version_, NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE);
}

Result<std::string> Library::nvml_version() const {
  return read_string(nvml_version_, NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE);
}

Result<unsigned> Library::device_count() const {
  Result<unsigned> result;
  result.code = device_count_(&result.value);
  return result;
}

Result<nvmlDevice_t> Library::device_handle(unsigned index) const {
  Result<nvmlDevice_t> result;
  result.code = handle_by_index_(index, &result.value);
  if (result.ok() && result.value == nullptr) result.code = NVML_ERROR_UNKNOWN;
  return result;
}

Result<std::string> Library::uuid(nvmlDevice_t device) const {
  return read_device_string(uuid_, device, NVML_DEVICE_UUID_V2_BUFFER_SIZE);
}

Result<std::string> Library::name(nvmlDevice_t device) const {
  return read_device_string(name_, device, NVML_DEVICE_NAME_V2_BUFFER_SIZE);
}

Result<std::string> Library::pci_bus_id(nvmlDevice_t device) const {
  Result<std::string> result = not_found<std::string>();
  for (const auto& bound : pci_info_) {
    // The modern layout is the larger one; old drivers write only its first 52 bytes.
    nvmlPciInfo_t pci{};
    result.code = bound.fn(device, &pci);
    if (try_older(result.code)) continue;
    if (result.ok()) {
      result.value = bound.variant >= 3 ? from_field(pci.busId, sizeof pci.busId)
                                        : from_field(pci.busIdLegacy, sizeof pci.busIdLegacy);
      result.value = normalize_bus_id(std::move(result.value));
    }
    return result;
  }
  return result;
}

Result<MemoryInfo> Library::memory(nvmlDevice_t device) const {
  Result<MemoryInfo> result = not_found<MemoryInfo>();
  if (memory_v2_ != nullptr) {
    nvmlMemory_v2_t memory{};
    memory.version = nvmlMemory_v2;
    result.code = memory_v2_(device, &memory);
    if (result.ok()) result.value = {memory.total, memory.used, memory.free};
    if (!try_older(result.code)) return result;
  }
  if (memory_v1_ != nullptr) {
    nvmlMemory_t memory{};
    result.code = memory_v1_(device, &memory);
    if (result.ok()) result.value = {memory.total, memory.used, memory.free};
  }
  return result;
}

Result<unsigned> Library::gpu_utilization(nvmlDevice_t device) const {
  if (utilization_ == nullptr) return not_found<unsigned>();
  nvmlUtilization_t utilization{};
  Result<unsigned> result;
  result.code = utilization_(device, &utilization);
  if (result.ok()) result.value = utilization.gpu;
  return result;
}

Result<unsigned> Library::power_usage_mw(nvmlDevice_t device) const {
  return read_unsigned(power_usage_, device);
}

Result<unsigned> Library::power_limit_mw(nvmlDevice_t device) const {
  Result<unsigned> enforced = read_unsigned(enforced_power_limit_, device);
  if (enforced.ok()) return enforced;
  Result<unsigned> configured = read_unsigned(power_management_limit_, device);
  if (configured.ok() || enforced_power_limit_ == nullptr) return configured;
  return enforced;
}

Result<nvmlComputeMode_t> Library::compute_mode(nvmlDevice_t device) const {
  if (compute_mode_ == nullptr) return not_found<nvmlComputeMode_t>();
  Result<nvmlComputeMode_t> result;
  result.code = compute_mode_(device, &result.value);
  return result;
}

Result<bool> Library::mig_enabled(nvmlDevice_t device) const {
  if (mig_mode_ == nullptr) return not_found<bool>();
  unsigned current = NVML_DEVICE_MIG_DISABLE;
  unsigned pending = NVML_DEVICE_MIG_DISABLE;
  Result<bool> result;
  result.code = mig_mode_(device, &current, &pending);
  if (result.ok()) result.value = current == NVML_DEVICE_MIG_ENABLE;
  return result;
}

Result<unsigned> Library::max_mig_device_count(nvmlDevice_t device) const {
  return read_unsigned(max_mig_device_count_, device);
}

Result<nvmlDevice_t> Library::mig_device_handle(nvmlDevice_t device, unsigned index) const {
  if (mig_handle_by_index_ == nullptr) return not_found<nvmlDevice_t>();
  Result<nvmlDevice_t> result;
  result.code = mig_handle_by_index_(device, index, &result.value);
  if (result.ok() && result.value == nullptr) result.code = NVML_ERROR_NOT_FOUND;
  return result;
}

Result<unsigned> Library::gpu_instance_id(nvmlDevice_t mig_device) const {
  return read_unsigned(gpu_instance_id_, mig_device);
}

Result<unsigned> Library::compute_instance_id(nvmlDevice_t mig_device) const {
  return read_unsigned(compute_instance_id_, mig_device);
}

Result<std::vector<ProcessEntry>> Library::compute_processes(nvmlDevice_t device) const {
  Result<std::vector<ProcessEntry>> result = not_found<std::vector<ProcessEntry>>();
  for (const auto& bound : processes_) {
    result = query_processes(bound.fn, static_cast<std::size_t>(bound.variant), device);
    if (!try_older(result.code)) return result;
  }
  return result;
}

Result<nvmlGpuTopologyLevel_t> Library::topology_common_ancestor(nvmlDevice_t a,
                                                                 nvmlDevice_t b) const {
  if (topology_ == nullptr) return not_found<nvmlGpuTopologyLevel_t>();
  Result<nvmlGpuTopologyLevel_t> result;
  result.code = topology_(a, b, &result.value);
  return result;
}

Result<bool> Library::nvlink_active(nvmlDevice_t device, unsigned link) const {
  if (nvlink_state_ == nullptr) return not_found<bool>();
  nvmlEnableState_t state = NVML_FEATURE_DISABLED;
  Result<bool> result;
  result.code = nvlink_state_(device, link, &state);
  if (result.ok()) result.value = state == NVML_FEATURE_ENABLED;
  return result;
}

Result<std::string> Library::nvlink_remote_bus_id(nvmlDevice_t device, unsigned link) const {
  if (nvlink_remote_pci_ == nullptr) return not_found<std::string>();
  nvmlPciInfo_t pci{};
  Result<std::string> result;
  result.code = nvlink_remote_pci_(device, link, &pci);
  if (result.ok()) result.value = normalize_bus_id(from_field(pci.busId, sizeof pci.busId));
  return result;
}

}  // namespace gpulock::nvml
