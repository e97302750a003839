// Lease::Impl: the state behind a Lease (its lock descriptors and the record shown to others).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpulock/lease.hpp"
#include "backend/lease_keeper.h"
#include "backend/holder_record.h"
#include "util/fd.h"

namespace gpulock {

class Lease::Impl {
 public:
  ~Impl();
  std::string id;
  std::vector<LeasedGpu> gpus;
  std::vector<UniqueFd> fds;  // local backend: one per GPU, each holding that GPU's OFD lock
  std::vector<int> raw_fds;
  // Redis backend: renews and finally releases the lease; its fencing token; the GPUs' host.
  std::unique_ptr<LeaseKeeper> keeper;
  std::uint64_t fencing_token = 0;
  std::string host;
  HolderRecord record;
  std::chrono::system_clock::time_point started_at;

  // Writes the record into every lock file (or hands it to the keeper). A failure (disk full)
  // loses only the details shown by `gpulock status`, never the lock; it is reported on stderr
  // once.
  void write_records();
};

}  // namespace gpulock
