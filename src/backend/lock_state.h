// LockState: what a backend knows about who holds one GPU, read without taking anything.
//
// The local backend reads it from the GPU's lock file (its OFD lock and the record inside); the
// Redis backend from the GPU's lock key and the lease's hash. The queue's explanations and
// `gpulock status` read only this, so they are the same on both.
#pragma once

#include <optional>
#include <string>

#include "backend/holder_record.h"

namespace gpulock {

struct LockState {
  bool locked = false;
  std::optional<HolderRecord> record;  // only when locked and the record is readable and valid
  std::string error;                   // the GPU's lock is unusable (planted symlink, garbage key)
};

}  // namespace gpulock
