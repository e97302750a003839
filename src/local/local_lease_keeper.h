// LocalLeaseKeeper: a local lease is its lock descriptors, one per GPU, each holding an OFD lock
// on the GPU's lock file. The kernel keeps the lease while any process holds a descriptor, so it
// can never be lost; destroying the keeper closes this process's copies.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/lease_keeper.h"
#include "util/fd.h"

namespace gpulock {

class LocalLeaseKeeper final : public LeaseKeeper {
 public:
  // `fds`: the locked descriptors of the lease's GPUs, in the lease's order. `links`: each
  // file's hard-link count as seen after it was locked (the first record is written by it,
  // without another fstat); empty: looked up. `record_offsets`: where each file takes the record
  // (a shared lease's slot); empty for offset 0 everywhere.
  explicit LocalLeaseKeeper(std::vector<UniqueFd> fds, std::vector<nlink_t> links = {},
                            std::vector<off_t> record_offsets = {});

  // Writes the record into every lock file.
  void publish_record(const HolderRecord& record) override;
  std::span<const int> lock_fds() const override { return raw_fds_; }
  std::uint64_t fencing_token() const override { return 0; }
  const std::string& gpu_host() const override;
  // Held while its descriptors are open: nothing to ask.
  std::uint64_t verify() override { return 0; }
  bool lost() const override { return false; }
  void on_lost(std::function<void(const std::string&)>) override {}
  // Descriptors survive fork as they are: the parent's copies close with its Lease, the child's
  // keep the lease.
  void prepare_fork() override {}
  bool belongs_to_this_process() const override { return true; }
  void disown() override {}
  void resume_in_child() override {}

 private:
  std::vector<UniqueFd> fds_;
  std::vector<int> raw_fds_;
  std::vector<nlink_t> links_when_locked_;  // emptied by the first publish_record
  std::vector<off_t> record_offsets_;
};

}  // namespace gpulock
