// LockState: what a backend knows about who holds one GPU, read without taking anything.
//
// The local backend reads it from the GPU's lock file (its OFD lock and the record inside); the
// Redis backend from the GPU's lock key and the lease's hash. The queue's explanations and
// `gpulock status` read only this, so they are the same on both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/holder_record.h"

namespace gpulock {

struct LockState {
  bool locked = false;
  // Held by shared leases (several jobs by memory) rather than one exclusive lease: then
  // `record` is unset and these say who holds what.
  bool shared = false;
  std::uint64_t shared_reserved_bytes = 0;   // memory reserved by the shared leases
  unsigned shared_jobs = 0;                  // how many shared leases hold it
  std::vector<HolderRecord> shared_records;  // with `with_record`: the readable ones
  std::optional<HolderRecord> record;  // only when locked and the record is readable and valid
  std::string error;                   // the GPU's lock is unusable (planted symlink, garbage key)
  // When the GPU's last lease began (or last wrote its record), in ns since the epoch, where the
  // backend knows: 0 for never or unknown. The queue gives the free GPU leased longest ago first.
  std::int64_t last_leased_ns = 0;
};

}  // namespace gpulock
