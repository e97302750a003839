// Names of the queue's enums, for people, JSON and the command line.
#include <fmt/format.h>

#include "gpulock/config.hpp"
#include "gpulock/error.hpp"
#include "gpulock/queue.hpp"
#include "util/strings.h"

namespace gpulock {

const char* priority_name(Priority priority) noexcept {
  return priority == Priority::kLow ? "low" : "normal";
}

Priority parse_priority(const std::string& text) {
  if (text == "normal") return Priority::kNormal;
  if (text == "low") return Priority::kLow;
  throw Error(ErrorCode::kInvalidArgument, fmt::format("priority '{}' is not 'normal' or 'low'",
                                                       sanitize_for_display(text, 64)));
}

const char* queue_standing_name(QueueStanding standing) noexcept {
  switch (standing) {
    case QueueStanding::kNext:
      return "next";
    case QueueStanding::kWaiting:
      return "waiting";
    case QueueStanding::kOverGpuLimit:
      return "over-gpu-limit";
    case QueueStanding::kOverWaitingLimit:
      return "over-waiting-limit";
  }
  return "waiting";
}

const char* queue_policy_name(QueuePolicy policy) noexcept {
  return policy == QueuePolicy::kFifo ? "fifo" : "fair-share";
}

}  // namespace gpulock
