// Intruders (gpulock/monitor.hpp): compute processes on a leased GPU that the lease's process
// tree does not contain, as gpu_status_of() marked them (`foreign`).
#include <fmt/format.h>

#include "gpulock/monitor.hpp"

namespace gpulock {

std::vector<Intruder> intruders_of(const PoolStatus& status) {
  std::vector<Intruder> found;
  for (const auto& gpu : status.gpus) {
    if (gpu.state != GpuState::kLeased || !gpu.holder) continue;
    for (const auto& process : gpu.processes) {
      if (!process.foreign) continue;
      Intruder intruder;
      intruder.pid = process.pid;
      intruder.user = process.user;
      intruder.used_memory_bytes = process.used_memory_bytes;
      intruder.host = gpu.host.empty() ? status.host : gpu.host;
      intruder.gpu = gpu.device.display_index();
      intruder.gpu_uuid = gpu.device.uuid;
      intruder.lease_id = gpu.holder->lease_id;
      intruder.holder_user = gpu.holder->user;
      found.push_back(std::move(intruder));
    }
  }
  return found;
}

std::string describe_intruder(const Intruder& intruder) {
  return fmt::format("intruder: pid {}{} on GPU {} leased by {} (lease {})", intruder.pid,
                     intruder.user.empty() ? "" : " (" + intruder.user + ")", intruder.gpu,
                     intruder.holder_user, intruder.lease_id);
}

}  // namespace gpulock
