// The unit in which shared leases reserve GPU memory, on both backends: a request is rounded up
// to whole units. The local backend locks one byte of a GPU's lock file per unit
// (local/gpu_lock_file.h, whose kSharedUnitBytes is this size); Redis counts units in its
// reservations (redis/redis_scripts.h).
#pragma once

#include <algorithm>
#include <cstdint>

namespace gpulock {

inline constexpr std::uint64_t kSharedMemoryUnitBytes = 256ull << 20;  // 256 MiB
inline constexpr std::uint64_t kSharedMemoryMostUnits = 8192;          // 2 TiB of GPU memory

// Units needed for `bytes` (rounded up; at least one; at most one more than a GPU can have).
inline std::uint64_t shared_memory_units(std::uint64_t bytes) {
  const std::uint64_t units =
      bytes / kSharedMemoryUnitBytes + (bytes % kSharedMemoryUnitBytes != 0);
  return std::clamp<std::uint64_t>(units, 1, kSharedMemoryMostUnits + 1);
}

}  // namespace gpulock
