// over_memory_check(): `gpulock run --on-over-memory`, a shared lease's memory watched through
// the device readings that `gpulock status` shows (include/gpulock/run.hpp).
#include <cstdio>
#include <map>
#include <memory>

#include "gpulock/parse.hpp"
#include "gpulock/run.hpp"
#include "gpulock/status.hpp"

namespace gpulock {

std::function<bool()> over_memory_check(GpuPool& pool, const Lease& lease,
                                        OverMemoryAction action) {
  // GPUs (by UUID) found over the reservation at the last look: warned about once until the
  // lease is back within it there.
  auto warned = std::make_shared<std::map<std::string, bool>>();
  return [&pool, id = lease.id(), action, warned]() {
    bool over_anywhere = false;
    PoolStatus status;
    try {
      status = pool.status();
    } catch (const std::exception&) {
      return false;  // no readings now: look again next time
    }
    for (const GpuStatus& gpu : status.gpus) {
      if (!gpu.shared) continue;
      for (const HolderInfo& h : gpu.shared->leases) {
        if (h.lease_id != id) continue;
        bool& said = (*warned)[gpu.device.uuid];
        if (!h.over_reservation) {
          said = false;
          continue;
        }
        over_anywhere = true;
        if (!said)
          std::fprintf(
              stderr,
              "gpulock: warning: lease %s uses %s of GPU %s, more than the %s it "
              "reserved%s\n",
              id.c_str(), format_size(h.memory_used_bytes).c_str(),
              gpu.device.display_index().c_str(), format_size(h.memory_bytes.value_or(0)).c_str(),
              action == OverMemoryAction::kTerm ? "; stopping the command (--on-over-memory=term)"
                                                : "");
        said = true;
      }
    }
    return over_anywhere && action == OverMemoryAction::kTerm;
  };
}

}  // namespace gpulock
