// A lease request as the queue sees it: its ticket, its plan request, and its health filters.
// Shared by both backends' acquire() and planners.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>

#include "gpulock/config.hpp"
#include "gpulock/device.hpp"
#include "gpulock/request.hpp"
#include "queue/schedule.h"
#include "queue/ticket.h"

namespace gpulock {

// A request as the queue sees it (a fresh id; registered only if it has to wait).
Ticket ticket_for_request(const LeaseRequest& request, std::size_t needed, const std::string& user);
// A ticket as the planner sees it (without health and fair-share history).
PlanRequest plan_request_for(const Ticket& ticket, const Config& config);
// The same, with its user's limits looked up already, written into `r`, a default PlanRequest
// (one just placed in a vector): a plan makes one per waiter, thousands, and a returned one
// would be moved and destroyed once more each. Inline, so that a plan writes the fields straight
// into place.
inline void fill_plan_request(const Ticket& t, const UserLimits& limits, PlanRequest& r) {
  r.seq = t.seq;
  r.uid = t.uid;
  r.priority = t.priority;
  r.needed = t.needed;
  r.named_gpus = t.named_gpus;
  r.entered_over_limit = t.entered_over_limit;
  // Tickets listed from the index have none yet: no copy (nor its call) for them.
  if (!t.candidates.empty()) r.candidates = t.candidates;
  r.limits = limits;
  r.shared_units = t.shared_units;
  r.shared_slots = t.shared_slots;
  r.spread = t.spread;
}

// The health filters of a ticket, as a request, to judge devices by.
LeaseRequest health_filters_of(const Ticket& ticket);
// The candidates of a ticket that fail its health filters now, with why (by UUID). `device_of`
// finds a device by UUID, nullptr for one that is gone.
std::map<std::string, std::string> unhealthy_candidates(
    const Ticket& ticket, const std::function<const Device*(const std::string&)>& device_of);

}  // namespace gpulock
