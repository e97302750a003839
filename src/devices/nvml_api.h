// nvml_api.h: the part of the NVML C API that gpulock calls, declared here in our own words.
//
// Written from NVIDIA's public NVML API Reference (docs.nvidia.com/deploy/nvml-api), not copied
// from nvml.h, so gpulock builds without the CUDA toolkit and loads libnvidia-ml.so.1 at run time
// (see nvml_library.h). Names follow the reference so each entry can be checked against it.
//
// Struct layouts are ABI: a wrong size scrambles what the driver writes (nvitop#75, pynvml#50).
// Every layout below carries a static_assert on its size, and the fake driver in
// tests/fake_nvml declares the same layouts independently, so a mistake on either side fails a
// test.
#pragma once

#include <cstddef>

namespace gpulock::nvml {

// ---- Return codes (nvmlReturn_t) -------------------------------------------------------------

enum nvmlReturn_t : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_INSUFFICIENT_POWER = 8,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_IRQ_ISSUE = 11,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_CORRUPTED_INFOROM = 14,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_OPERATING_SYSTEM = 17,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
  NVML_ERROR_IN_USE = 19,
  NVML_ERROR_MEMORY = 20,
  NVML_ERROR_NO_DATA = 21,
  NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
  NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
  NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,  // a versioned struct carried a version it rejects
  NVML_ERROR_DEPRECATED = 26,
  NVML_ERROR_NOT_READY = 27,
  NVML_ERROR_GPU_NOT_FOUND = 28,
  NVML_ERROR_INVALID_STATE = 29,
  NVML_ERROR_UNKNOWN = 999,
};

// ---- Handles and enums -----------------------------------------------------------------------

struct nvmlDevice_st;  // opaque; a GPU handle or a MIG device handle
using nvmlDevice_t = nvmlDevice_st*;

enum nvmlEnableState_t : int { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 };

enum nvmlComputeMode_t : int {
  NVML_COMPUTEMODE_DEFAULT = 0,
  NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 1,  // deprecated by NVIDIA, still reported by old drivers
  NVML_COMPUTEMODE_PROHIBITED = 2,
  NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3,
};

// How close two GPUs are on the PCIe tree; the values are spaced by NVIDIA on purpose.
enum nvmlGpuTopologyLevel_t : int {
  NVML_TOPOLOGY_INTERNAL = 0,     // same board (e.g. dual-GPU cards)
  NVML_TOPOLOGY_SINGLE = 10,      // one PCIe switch
  NVML_TOPOLOGY_MULTIPLE = 20,    // several switches, no host bridge
  NVML_TOPOLOGY_HOSTBRIDGE = 30,  // same host bridge
  NVML_TOPOLOGY_NODE = 40,        // same NUMA node (was NVML_TOPOLOGY_CPU)
  NVML_TOPOLOGY_SYSTEM = 50,      // across sockets
};

// ---- Constants -------------------------------------------------------------------------------

inline constexpr unsigned NVML_DEVICE_UUID_BUFFER_SIZE = 80;
inline constexpr unsigned NVML_DEVICE_UUID_V2_BUFFER_SIZE = 96;  // enough for MIG UUIDs
inline constexpr unsigned NVML_DEVICE_NAME_BUFFER_SIZE = 64;
inline constexpr unsigned NVML_DEVICE_NAME_V2_BUFFER_SIZE = 96;
inline constexpr unsigned NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80;
inline constexpr unsigned NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE = 80;
inline constexpr unsigned NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32;     // "00000000:3B:00.0"
inline constexpr unsigned NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16;  // "0000:3B:00.0"

inline constexpr unsigned NVML_NVLINK_MAX_LINKS = 18;  // 6, then 12 in older headers

inline constexpr unsigned NVML_DEVICE_MIG_DISABLE = 0;
inline constexpr unsigned NVML_DEVICE_MIG_ENABLE = 1;

// Reported in 64-bit fields (e.g. a process's usedGpuMemory) when the driver does not know.
inline constexpr unsigned long long NVML_VALUE_NOT_AVAILABLE = ~0ULL;
// gpuInstanceId / computeInstanceId of a process when MIG is off.
inline constexpr unsigned NVML_INSTANCE_ID_NONE = 0xFFFFFFFFU;

// Versioned structs carry their size in the low 24 bits and the version above them.
constexpr unsigned nvml_struct_version(std::size_t size, unsigned version) {
  return static_cast<unsigned>(size) | (version << 24U);
}

// ---- Structs ---------------------------------------------------------------------------------

// nvmlDeviceGetMemoryInfo: total == free + used.
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(nvmlMemory_t) == 24);

// nvmlDeviceGetMemoryInfo_v2: adds a version field (must be nvmlMemory_v2) and reserved memory.
struct nvmlMemory_v2_t {
  unsigned version;
  unsigned long long total;
  unsigned long long reserved;  // set aside by the driver/firmware
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(nvmlMemory_v2_t) == 40);
inline constexpr unsigned nvmlMemory_v2 = nvml_struct_version(sizeof(nvmlMemory_v2_t), 2);

// nvmlDeviceGetPciInfo_v3 (and nvmlDeviceGetNvLinkRemotePciInfo_v2) fill this layout, with the
// 8-hex-digit domain form in busId. The first 36 bytes match the legacy layout below, so a
// buffer of this type is big enough for every version.
struct nvmlPciInfo_t {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;  // device id << 16 | vendor id
  unsigned pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
};
static_assert(sizeof(nvmlPciInfo_t) == 68);

// The layout of the unversioned nvmlDeviceGetPciInfo on old drivers: a 16-byte bus id with a
// 4-digit domain, then four reserved words.
struct nvmlPciInfoLegacy_t {
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pciDeviceId;
  unsigned pciSubSystemId;
  unsigned reserved[4];
};
static_assert(sizeof(nvmlPciInfoLegacy_t) == 52);
static_assert(offsetof(nvmlPciInfoLegacy_t, busId) == offsetof(nvmlPciInfo_t, busIdLegacy));

// nvmlDeviceGetUtilizationRates: percentages over the driver's last sample period.
struct nvmlUtilization_t {
  unsigned gpu;
  unsigned memory;
};
static_assert(sizeof(nvmlUtilization_t) == 8);

// Process entries written by nvmlDeviceGetComputeRunningProcesses*. Which one a driver writes is
// NOT reliably given by the symbol's suffix (see Library::compute_processes):
//   plain  nvmlDeviceGetComputeRunningProcesses     -> v1 (16 bytes)
//   _v2                                             -> v2 (24 bytes)
//   _v3    per the reference                        -> v2 layout (24 bytes); but R535-era
//          drivers wrote v3 (32 bytes, nvitop PR#79) and at least one R550 build wrote v1
//          (16 bytes, nvitop PR#226).
struct nvmlProcessInfo_v1_t {
  unsigned pid;
  unsigned long long usedGpuMemory;  // bytes, or NVML_VALUE_NOT_AVAILABLE
};
static_assert(sizeof(nvmlProcessInfo_v1_t) == 16);

struct nvmlProcessInfo_v2_t {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId;      // NVML_INSTANCE_ID_NONE unless MIG is on
  unsigned computeInstanceId;  // NVML_INSTANCE_ID_NONE unless MIG is on
};
static_assert(sizeof(nvmlProcessInfo_v2_t) == 24);
static_assert(offsetof(nvmlProcessInfo_v2_t, usedGpuMemory) == 8);
static_assert(offsetof(nvmlProcessInfo_v2_t, gpuInstanceId) == 16);
static_assert(offsetof(nvmlProcessInfo_v2_t, computeInstanceId) == 20);

struct nvmlProcessInfo_v3_t {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId;
  unsigned computeInstanceId;
  unsigned long long usedGpuCcProtectedMemory;  // confidential-computing memory
};
static_assert(sizeof(nvmlProcessInfo_v3_t) == 32);

// ---- Function pointer types, one per entry point we look up ----------------------------------

using nvmlInit_fn = nvmlReturn_t (*)();  // nvmlInit_v2, or nvmlInit on old drivers
using nvmlShutdown_fn = nvmlReturn_t (*)();
using nvmlErrorString_fn = const char* (*)(nvmlReturn_t result);
using nvmlSystemGetString_fn = nvmlReturn_t (*)(char* buffer, unsigned length);  // driver/NVML
using nvmlDeviceGetCount_fn = nvmlReturn_t (*)(unsigned* count);
using nvmlDeviceGetHandleByIndex_fn = nvmlReturn_t (*)(unsigned index, nvmlDevice_t* device);
using nvmlDeviceGetString_fn = nvmlReturn_t (*)(nvmlDevice_t device, char* buffer,
                                                unsigned length);  // UUID, name
using nvmlDeviceGetPciInfo_fn = nvmlReturn_t (*)(nvmlDevice_t device, nvmlPciInfo_t* pci);
using nvmlDeviceGetMemoryInfo_fn = nvmlReturn_t (*)(nvmlDevice_t device, nvmlMemory_t* memory);
using nvmlDeviceGetMemoryInfo_v2_fn = nvmlReturn_t (*)(nvmlDevice_t device,
                                                       nvmlMemory_v2_t* memory);
using nvmlDeviceGetUtilizationRates_fn = nvmlReturn_t (*)(nvmlDevice_t device,
                                                          nvmlUtilization_t* utilization);
// nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementLimit
// (milliwatts), nvmlDeviceGetMaxMigDeviceCount, nvmlDeviceGetGpuInstanceId,
// nvmlDeviceGetComputeInstanceId.
using nvmlDeviceGetUnsigned_fn = nvmlReturn_t (*)(nvmlDevice_t device, unsigned* value);
using nvmlDeviceGetComputeMode_fn = nvmlReturn_t (*)(nvmlDevice_t device, nvmlComputeMode_t* mode);
using nvmlDeviceGetMigMode_fn = nvmlReturn_t (*)(nvmlDevice_t device, unsigned* current_mode,
                                                 unsigned* pending_mode);
using nvmlDeviceGetMigDeviceHandleByIndex_fn = nvmlReturn_t (*)(nvmlDevice_t device, unsigned index,
                                                                nvmlDevice_t* mig_device);
// `infos` points at an array of whichever nvmlProcessInfo_v*_t the driver writes (see above).
// Called with *info_count == 0 and infos == nullptr it reports the count it needs.
using nvmlDeviceGetComputeRunningProcesses_fn = nvmlReturn_t (*)(nvmlDevice_t device,
                                                                 unsigned* info_count, void* infos);
using nvmlDeviceGetTopologyCommonAncestor_fn = nvmlReturn_t (*)(nvmlDevice_t device1,
                                                                nvmlDevice_t device2,
                                                                nvmlGpuTopologyLevel_t* level);
using nvmlDeviceGetNvLinkState_fn = nvmlReturn_t (*)(nvmlDevice_t device, unsigned link,
                                                     nvmlEnableState_t* is_active);
using nvmlDeviceGetNvLinkRemotePciInfo_fn = nvmlReturn_t (*)(nvmlDevice_t device, unsigned link,
                                                             nvmlPciInfo_t* pci);

}  // namespace gpulock::nvml
