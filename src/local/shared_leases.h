// Shared leases in a GPU's lock file: who holds which memory units, read without taking
// anything, and how a new shared lease chooses and locks its units.
//
// The byte layout is in gpu_lock_file.h. Every fact here comes from the kernel's OFD locks
// (F_OFD_GETLK), so it is never stale: a shared lease's units, its slot and its "shared" mark
// go the moment its last descriptor closes, SIGKILL included. Records are for display only and
// believed only while their slot byte is locked.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/holder_record.h"
#include "gpulock/config.hpp"
#include "gpulock/device.hpp"
#include "gpulock/request.hpp"

namespace gpulock {

// What the locks of one lock file say about shared use.
struct SharedUsage {
  off_t units_held = 0;                            // memory units locked by shared leases
  std::vector<std::pair<off_t, off_t>> unit_runs;  // (first unit, count), in order
  std::vector<off_t> slots;                        // record slots of live shared leases
};

// Reads the unit and slot locks of the lock file open at fd (read-only is enough).
SharedUsage read_shared_usage(int fd);

// The record of the shared lease in `slot`, if it is readable, valid and names `uuid`.
std::optional<HolderRecord> read_shared_record(int fd, off_t slot, const std::string& uuid);

// Units needed for `bytes` (rounded up; at least one).
off_t units_for(std::uint64_t bytes);

// The units a shared request (memory_bytes or slots) wants on a GPU of `total_units`.
off_t shared_units_wanted(const LeaseRequest& request, off_t total_units);

// How a GPU stands for shared leases: its units in all, those the reserve and processes
// outside gpulock take, those leases hold, and how many leases it carries.
struct SharedFit {
  off_t total_units = 0;
  off_t outside_units = 0;  // the configured reserve plus memory used by non-gpulock processes
  off_t held_units = 0;
  unsigned jobs = 0;
  off_t free_units() const {
    const off_t left = total_units - outside_units - held_units;
    return left > 0 ? left : 0;
  }
};

// `covered_bytes`: memory the device reports for processes covered by gpulock leases on it
// (they are inside reservations, not outside them).
SharedFit shared_fit(const Device& device, const SharedUsage& usage, const Config& config,
                     std::uint64_t covered_bytes);

// Locks `wanted` free units among [0, total_units) of the file open read-write at fd, plus the
// shared mark (byte 0, read lock) and the slot of the first unit, without waiting. Returns the
// slot, or nullopt if the file is held exclusively or the units are taken meanwhile (a process
// outside gpulock's protocol); then nothing stays locked by this call (the caller closes fd).
std::optional<off_t> lock_shared_units(int fd, off_t total_units, off_t wanted);

}  // namespace gpulock
