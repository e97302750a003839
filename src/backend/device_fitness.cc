// Device fitness for a request: permanent reasons (MIG, compute mode, size, the admin's
// exclusions) and momentary ones (health filters, processes of people not using gpulock).
#include "backend/device_fitness.h"

#include <fmt/format.h>

#include "gpulock/parse.hpp"
#include "util/strings.h"

namespace gpulock {

std::string describe_device(const Device& d) {
  return "GPU " + d.display_index();
}

bool excluded_by_config(const Device& d, const Config& config) {
  for (const auto& entry : config.excluded_gpus) {
    if (entry == d.display_index() || entry == d.name) return true;
    if (entry.size() >= 5 && starts_with_ignoring_case(d.uuid, entry)) return true;
  }
  return false;
}

std::string never_reason(const Device& d, const LeaseRequest& r, const Config& config) {
  if (excluded_by_config(d, config))
    return describe_device(d) + " is excluded by the administrator (" +
           (config.source.empty() ? std::string("config") : config.source) + ")";
  if (d.mig_enabled.value_or(false))
    return describe_device(d) + " has MIG enabled: lease its MIG instances instead";
  if (d.compute_mode == ComputeMode::kProhibited)
    return describe_device(d) + " is in compute mode 'prohibited'";
  if (r.min_free_memory_bytes && d.memory_total_bytes &&
      *d.memory_total_bytes < *r.min_free_memory_bytes)
    return fmt::format("{} has only {} in total", describe_device(d),
                       format_size(*d.memory_total_bytes));
  return "";
}

// Reads the readings same_readiness_inputs() compares: keep the two in step.
std::string unready_reason(const Device& d, const LeaseRequest& r) {
  const std::string name = describe_device(d);
  if (r.min_free_memory_bytes) {
    if (!d.memory_free_bytes) return name + ": free memory unknown";
    if (*d.memory_free_bytes < *r.min_free_memory_bytes)
      return fmt::format("{}: {} free, {} needed", name, format_size(*d.memory_free_bytes),
                         format_size(*r.min_free_memory_bytes));
  }
  if (r.max_utilization_percent) {
    if (!d.utilization_percent) return name + ": utilisation unknown";
    if (*d.utilization_percent > *r.max_utilization_percent)
      return fmt::format("{}: {}% busy, at most {}% allowed", name, *d.utilization_percent,
                         *r.max_utilization_percent);
  }
  if (r.max_power_watts) {
    if (!d.power_draw_watts) return name + ": power draw unknown";
    if (*d.power_draw_watts > *r.max_power_watts)
      return fmt::format("{}: drawing {:.0f} W, at most {:.0f} W allowed", name,
                         *d.power_draw_watts, *r.max_power_watts);
  }
  if (!r.allow_foreign_processes && !d.processes_known)
    return name + ": its processes cannot be listed (--allow-foreign to accept it)";
  if (!r.allow_foreign_processes && !d.processes.empty()) {
    std::string pids;
    for (std::size_t i = 0; i < d.processes.size() && i < 4; ++i)
      pids += (i ? ", " : "") + std::to_string(d.processes[i].pid);
    if (d.processes.size() > 4) pids += ", …";
    return fmt::format("{}: used by process{} {} outside gpulock (--allow-foreign to share)", name,
                       d.processes.size() > 1 ? "es" : "", pids);
  }
  return "";
}

bool same_readiness_inputs(const Device& a, const Device& b, const LeaseRequest& in_use) {
  if (in_use.min_free_memory_bytes && a.memory_free_bytes != b.memory_free_bytes) return false;
  if (in_use.max_utilization_percent && a.utilization_percent != b.utilization_percent)
    return false;
  if (in_use.max_power_watts && a.power_draw_watts != b.power_draw_watts) return false;
  return in_use.allow_foreign_processes ||
         (a.processes_known == b.processes_known && a.processes.empty() == b.processes.empty());
}

}  // namespace gpulock
