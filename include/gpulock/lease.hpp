// Lease: exclusive use of one or more GPUs, held until it is released or destroyed.
//
// A Lease owns kernel locks on the GPUs' lock files. It is move-only; destroying it releases
// the GPUs. Processes started with the lease's descriptors (see lock_fds() and
// run_command()) share the locks: the GPUs stay leased until every process holding them has
// exited, however it exits, SIGKILL included.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <sys/types.h>

namespace gpulock {

struct LeasedGpu {
  unsigned index = 0;
  std::string display_index;  // "0", or "0:1" for a MIG instance
  std::string uuid;
  std::string name;
  bool is_mig_instance = false;
};

// How CUDA_VISIBLE_DEVICES names the GPUs: NVML indices (with CUDA_DEVICE_ORDER=PCI_BUS_ID so
// CUDA numbers them the same way), or UUIDs. MIG instances are always named by UUID, the only
// form CUDA accepts for them.
enum class VisibleFormat { kIndex, kUuid };

class Lease {
 public:
  Lease();  // an empty, already-released lease
  Lease(Lease&&) noexcept;
  Lease& operator=(Lease&&) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  bool active() const;
  const std::string& id() const;
  const std::vector<LeasedGpu>& gpus() const;
  std::chrono::system_clock::time_point started_at() const;

  // The value for CUDA_VISIBLE_DEVICES.
  std::string cuda_visible_devices(VisibleFormat format = VisibleFormat::kIndex) const;
  // Comma-separated UUIDs (GPULOCK_GPUS).
  std::string uuid_list() const;

  // The descriptors that hold the locks; a child process that inherits them keeps the lease.
  std::span<const int> lock_fds() const;

  // Records that the lease now also covers this process and its descendants, and how it is held,
  // for `gpulock status`. `kind` is "process", "run" or "detached".
  // With `member` (> 0), the lease also covers that process, in the same single update.
  void set_holder(pid_t holder_pid, const std::string& kind, pid_t member = 0);
  void add_member(pid_t pid);

  // Releases the GPUs now (for this process: children holding the descriptors keep them).
  void release();

  class Impl;
  explicit Lease(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpulock
