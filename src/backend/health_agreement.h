// Whether two readings of the same GPUs would give the queue's waiting requests the same health
// verdicts. A Redis waiter judges its own host's GPUs by their live readings and waiters on other
// hosts judge them by the readings this host registered; where the two verdicts differ for some
// request, the two plans disagree on who is served (design-redis.md, "Waiters agree on health").
#pragma once

#include <vector>

#include "gpulock/device.hpp"
#include "queue/ticket.h"

namespace gpulock {

// One GPU's readings as registered (what other hosts plan with) and as read now.
struct RegisteredAndLive {
  const Device* registered = nullptr;
  const Device* live = nullptr;  // same UUID
};

// True if some ticket would find one of its candidates among `gpus` fit by one reading and
// unfit by the other. Readings that no ticket's filters read may differ freely.
bool health_verdicts_differ(const std::vector<Ticket>& tickets,
                            const std::vector<RegisteredAndLive>& gpus);

}  // namespace gpulock
