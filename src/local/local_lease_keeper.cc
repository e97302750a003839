// LocalLeaseKeeper: the lock descriptors of a local lease, and its record in the lock files.
#include "local/local_lease_keeper.h"

#include <sys/stat.h>

#include <cstdio>

#include "local/gpu_lock_file.h"

namespace gpulock {

LocalLeaseKeeper::LocalLeaseKeeper(std::vector<UniqueFd> fds, std::vector<nlink_t> links,
                                   std::vector<off_t> record_offsets)
    : fds_(std::move(fds)),
      links_when_locked_(std::move(links)),
      record_offsets_(std::move(record_offsets)) {
  for (const auto& fd : fds_) raw_fds_.push_back(fd.get());
  record_offsets_.resize(fds_.size(), 0);
}

const std::string& LocalLeaseKeeper::gpu_host() const {
  static const std::string none;
  return none;
}

void LocalLeaseKeeper::publish_record(const HolderRecord& record) {
  const std::string bytes = serialize_holder_record(record);
  const std::vector<nlink_t> known = std::move(links_when_locked_);
  links_when_locked_.clear();
  for (std::size_t i = 0; i < fds_.size(); ++i) {
    const UniqueFd& fd = fds_[i];
    // A lock file with other hard links may be someone's file too: lock it, never write it.
    struct stat st {};
    if (i < known.size())
      st.st_nlink = known[i];
    else if (::fstat(fd.get(), &st) != 0)
      continue;
    if (st.st_nlink != 1) continue;
    if (const auto problem = write_record_bytes(fd.get(), bytes, record_offsets_[i])) {
      std::fprintf(stderr, "gpulock: warning: lease %s: %s (the lease itself is held)\n",
                   record.lease_id.c_str(), problem->c_str());
      return;
    }
  }
}

}  // namespace gpulock
