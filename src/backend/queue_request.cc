// A lease request as the queue sees it (backend/queue_request.h).
#include "backend/queue_request.h"

#include <unistd.h>

#include "backend/device_fitness.h"
#include "process/process_identity.h"
#include "util/random_id.h"
#include "util/unix_time.h"

namespace gpulock {

Ticket ticket_for_request(const LeaseRequest& request, std::size_t needed,
                          const std::string& user) {
  Ticket t;
  t.id = make_lease_id();
  t.uid = ::geteuid();
  t.user = user;
  t.process = self_process_id();
  t.enqueued_at = unix_seconds(std::chrono::system_clock::now());
  t.priority = request.priority;
  t.needed = static_cast<unsigned>(needed);
  t.named_gpus = !request.gpus.empty();
  t.min_free_memory_bytes = request.min_free_memory_bytes;
  t.max_utilization_percent = request.max_utilization_percent;
  t.max_power_watts = request.max_power_watts;
  t.allow_foreign_processes = request.allow_foreign_processes;
  t.label = request.label;
  t.command = request.command;
  return t;
}

PlanRequest plan_request_for(const Ticket& t, const Config& config) {
  PlanRequest r;
  fill_plan_request(t, config.limits_for(t.user), r);
  return r;
}

LeaseRequest health_filters_of(const Ticket& t) {
  LeaseRequest r;
  r.min_free_memory_bytes = t.min_free_memory_bytes;
  r.max_utilization_percent = t.max_utilization_percent;
  r.max_power_watts = t.max_power_watts;
  r.allow_foreign_processes = t.allow_foreign_processes;
  return r;
}

std::map<std::string, std::string> unhealthy_candidates(
    const Ticket& t, const std::function<const Device*(const std::string&)>& device_of) {
  const LeaseRequest filters = health_filters_of(t);
  std::map<std::string, std::string> reasons;
  for (const auto& uuid : t.candidates) {
    const Device* device = device_of(uuid);
    if (device == nullptr) continue;
    std::string reason = unready_reason(*device, filters);
    if (!reason.empty()) reasons.emplace(uuid, std::move(reason));
  }
  return reasons;
}

}  // namespace gpulock
