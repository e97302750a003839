// Lease::Impl: the state behind a Lease (its lock descriptors and the record shown to others).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "gpulock/lease.hpp"
#include "local/holder_record.h"
#include "util/fd.h"

namespace gpulock {

class Lease::Impl {
 public:
  std::string id;
  std::vector<LeasedGpu> gpus;
  std::vector<UniqueFd> fds;  // one per GPU, each holding that GPU's OFD lock
  std::vector<int> raw_fds;
  HolderRecord record;
  std::chrono::system_clock::time_point started_at;

  // Writes the record into every lock file. A failure (disk full) loses only the details shown
  // by `gpulock status`, never the lock; it is reported on stderr once.
  void write_records();
};

}  // namespace gpulock
