// LocalLeaseKeeper: the lock descriptors of a local lease, and its record in the lock files.
#include "local/local_lease_keeper.h"

#include <sys/stat.h>

#include <cstdio>

#include "local/gpu_lock_file.h"

namespace gpulock {

LocalLeaseKeeper::LocalLeaseKeeper(std::vector<UniqueFd> fds, std::vector<off_t> record_offsets)
    : fds_(std::move(fds)), record_offsets_(std::move(record_offsets)) {
  for (const auto& fd : fds_) raw_fds_.push_back(fd.get());
  record_offsets_.resize(fds_.size(), 0);
}

const std::string& LocalLeaseKeeper::gpu_host() const {
  static const std::string none;
  return none;
}

void LocalLeaseKeeper::publish_record(const HolderRecord& record) {
  const std::string bytes = serialize_holder_record(record);
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    const UniqueFd& fd = fds_[i];
    // A lock file with other hard links may be someone's file too: lock it, never write it.
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || st.st_nlink != 1) continue;
    if (const auto problem = write_record_bytes(fd.get(), bytes, record_offsets_[i])) {
      std::fprintf(stderr, "gpulock: warning: lease %s: %s (the lease itself is held)\n",
                   record.lease_id.c_str(), problem->c_str());
      return;
    }
  }
}

}  // namespace gpulock
