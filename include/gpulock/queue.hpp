// The machine's queue of waiting requests, as `gpulock queue` and `gpulock status` show it.
//
// Every request that cannot be served at once registers itself in the queue (a ticket file that
// its process holds locked, so a waiter that dies leaves the queue by itself) and is served in
// the order of the administrator's policy: fair share between users by default, or FIFO; low
// priority requests after all normal ones. A multi-GPU request that must wait reserves the free
// GPUs it could use, so later requests cannot starve it; they may only use GPUs it cannot use.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpulock {

enum class Priority { kNormal, kLow };
const char* priority_name(Priority priority) noexcept;  // "normal", "low"
// "normal" or "low"; throws Error(kInvalidArgument) for anything else.
Priority parse_priority(const std::string& text);

// Where a waiting request stands.
enum class QueueStanding {
  kNext,             // its GPUs are free and it is being woken to take them
  kWaiting,          // waiting for GPUs (reserving the free ones it can use, if any)
  kOverGpuLimit,     // serving it would put its user over the GPUs the limit allows
  kOverWaitingLimit  // its user has more waiting requests than the limit lets take part
};
const char* queue_standing_name(QueueStanding standing) noexcept;  // "next", "waiting", ...

struct QueueEntry {
  int position = 0;  // 1 = served first; requests held back by a limit come last
  std::string ticket_id;
  unsigned uid = 0;
  std::string user;
  int pid = 0;
  Priority priority = Priority::kNormal;
  unsigned gpus_requested = 0;
  // A shared request (several jobs per GPU): the memory it asks for on each GPU, or its slots.
  std::optional<std::uint64_t> memory_bytes;
  std::optional<unsigned> slots;
  std::vector<std::string> gpus_named;  // explicit GPUs (UUIDs), empty for "any N"
  std::string label;
  std::string command;
  std::chrono::system_clock::time_point waiting_since;
  QueueStanding standing = QueueStanding::kWaiting;
  std::vector<std::string> reserved_gpus;  // UUIDs of free GPUs held back for it
  std::string blocked_by;                  // one line, for people: what it waits for
};

struct QueueStatus {
  std::string policy;                 // "fair-share" or "fifo"
  std::string config_source;          // the config file read, "" for defaults
  std::vector<QueueEntry> entries;    // in serving order
  std::vector<std::string> warnings;  // e.g. tickets that could not be read
};

}  // namespace gpulock
