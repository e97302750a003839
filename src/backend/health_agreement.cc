// Health verdicts of registered against live readings (backend/health_agreement.h).
#include "backend/health_agreement.h"

#include <map>
#include <string>
#include <string_view>

#include "backend/device_fitness.h"
#include "backend/queue_request.h"

namespace gpulock {

bool health_verdicts_differ(const std::vector<Ticket>& tickets,
                            const std::vector<RegisteredAndLive>& gpus) {
  // The filters some ticket uses (any value): a GPU whose two readings agree on all of them
  // gets the same verdicts, and is not looked at per ticket (on NVML the power draw differs at
  // every read, and matters only while some ticket filters on it).
  LeaseRequest in_use;
  in_use.allow_foreign_processes = true;
  for (const Ticket& t : tickets) {
    if (t.min_free_memory_bytes) in_use.min_free_memory_bytes = 0;
    if (t.max_utilization_percent) in_use.max_utilization_percent = 0;
    if (t.max_power_watts) in_use.max_power_watts = 0;
    if (!t.allow_foreign_processes) in_use.allow_foreign_processes = false;
  }
  std::map<std::string_view, RegisteredAndLive> differing;
  for (const RegisteredAndLive& gpu : gpus)
    if (!same_readiness_inputs(*gpu.registered, *gpu.live, in_use))
      differing.emplace(gpu.live->uuid, gpu);
  if (differing.empty()) return false;
  for (const Ticket& t : tickets) {
    const LeaseRequest filters = health_filters_of(t);
    for (const std::string& uuid : t.candidates) {
      const auto it = differing.find(uuid);
      if (it == differing.end()) continue;
      if (unready_reason(*it->second.registered, filters).empty() !=
          unready_reason(*it->second.live, filters).empty())
        return true;
    }
  }
  return false;
}

}  // namespace gpulock
