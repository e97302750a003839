// Reading and taking shared leases' byte-range locks in a GPU's lock file.
#include "local/shared_leases.h"

#include <fcntl.h>

#include <algorithm>

#include "local/gpu_lock_file.h"

namespace gpulock {

SharedUsage read_shared_usage(int fd) {
  SharedUsage usage;
  for (const auto& [start, len] : held_ranges(fd, kSharedUnitLockBase, kSharedMaxUnits)) {
    usage.unit_runs.emplace_back(start - kSharedUnitLockBase, len);
    usage.units_held += len;
  }
  // Each live lease locks one slot byte of its own, so every held range there is one lease
  // (adjacent bytes of different leases are separate locks, and GETLK reports them one by one).
  for (const auto& [start, len] : held_ranges(fd, kSharedSlotLockBase, kSharedMaxUnits))
    for (off_t s = start; s < start + len; ++s) usage.slots.push_back(s - kSharedSlotLockBase);
  return usage;
}

std::optional<HolderRecord> read_shared_record(int fd, off_t slot, const std::string& uuid) {
  auto record = parse_holder_record(
      read_record_bytes(fd, kSharedRecordBase + slot * static_cast<off_t>(kHolderRecordSize)));
  if (!record || !record->memory_bytes ||
      std::find(record->gpus.begin(), record->gpus.end(), uuid) == record->gpus.end())
    return std::nullopt;
  return record;
}

off_t units_for(std::uint64_t bytes) {
  const std::uint64_t units = (bytes + kSharedUnitBytes - 1) / kSharedUnitBytes;
  return static_cast<off_t>(std::max<std::uint64_t>(
      1, std::min<std::uint64_t>(units, static_cast<std::uint64_t>(kSharedMaxUnits) + 1)));
}

SharedFit shared_fit(const Device& device, const SharedUsage& usage, const Config& config,
                     std::uint64_t covered_bytes) {
  SharedFit fit;
  const std::uint64_t total = device.memory_total_bytes.value_or(0);
  fit.total_units =
      static_cast<off_t>(std::min<std::uint64_t>(total / kSharedUnitBytes, kSharedMaxUnits));
  const std::uint64_t used = device.memory_used_bytes.value_or(0);
  const std::uint64_t outside =
      config.shared_memory_reserve_bytes + (used > covered_bytes ? used - covered_bytes : 0);
  fit.outside_units = outside == 0 ? 0 : units_for(outside);
  fit.held_units = usage.units_held;
  fit.jobs = static_cast<unsigned>(usage.slots.size());
  return fit;
}

std::optional<off_t> lock_shared_units(int fd, off_t total_units, off_t wanted) {
  if (!try_lock_range(fd, F_RDLCK, 0, 1)) return std::nullopt;  // held exclusively
  // The lowest free units, run by run.
  const SharedUsage usage = read_shared_usage(fd);
  std::vector<std::pair<off_t, off_t>> take;
  off_t pos = 0;
  off_t left = wanted;
  auto take_gap = [&](off_t gap_end) {
    gap_end = std::min(gap_end, total_units);
    if (pos < gap_end && left > 0) {
      const off_t n = std::min(left, gap_end - pos);
      take.emplace_back(pos, n);
      left -= n;
    }
  };
  for (const auto& [first, count] : usage.unit_runs) {
    take_gap(first);
    pos = std::max(pos, first + count);
  }
  take_gap(total_units);
  const auto undo = [&] {
    // Unlocking the whole file drops every lock this description holds, and only those.
    unlock(fd);
    return std::nullopt;
  };
  if (left > 0) return undo();
  for (const auto& [first, count] : take)
    if (!try_lock_range(fd, F_WRLCK, kSharedUnitLockBase + first, count)) return undo();
  const off_t slot = take.front().first;
  if (!try_lock_range(fd, F_WRLCK, kSharedSlotLockBase + slot, 1)) return undo();
  return slot;
}

}  // namespace gpulock
