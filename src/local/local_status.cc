// LocalBackend::status(): every device with its state, holder and processes, read without
// locking.
#include "backend/gpu_status.h"
#include "local/local_backend.h"
#include "process/process_identity.h"

namespace gpulock {

PoolStatus LocalBackend::status() {
  PoolStatus status;
  status.host = host_name();
  status.device_source = source_->description();
  status.simulated = source_->simulated();
  status.lock_dir = dir_.path().string();
  status.taken_at = std::chrono::system_clock::now();
  status.warnings = dir_.warnings();
  status.warnings.insert(status.warnings.end(), dir_.advice().begin(), dir_.advice().end());

  std::vector<Device> devices = source_->devices();
  const QueueStatus queue_now = queue_status(&devices);
  for (Device& device : devices) {
    const LockState p = probe(device.uuid, true);
    status.gpus.push_back(gpu_status_of(std::move(device), p, config_, true, true));
  }

  status.queue_length = static_cast<int>(queue_now.entries.size());
  status.queue_policy = queue_now.policy;
  status.warnings.insert(status.warnings.end(), queue_now.warnings.begin(),
                         queue_now.warnings.end());
  mark_reservations(status, queue_now);
  return status;
}

}  // namespace gpulock
