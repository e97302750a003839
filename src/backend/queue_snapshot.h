// QueueSnapshot: the queue as one backend read and planned it, and its explanations for people
// (why a request waits, what blocks it, why it was not served). Shared by both backends.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "backend/holder_record.h"
#include "backend/lock_state.h"
#include "gpulock/config.hpp"
#include "gpulock/error.hpp"
#include "gpulock/queue.hpp"
#include "gpulock/request.hpp"
#include "queue/schedule.h"
#include "queue/ticket.h"

namespace gpulock {

// The tickets (the plan's requests, in the same order), the GPUs as the plan saw them, and the
// plan.
struct QueueSnapshot {
  std::vector<Ticket> tickets;
  std::vector<PlannedGpu> gpus;
  std::vector<LockState> locks;        // parallel to gpus
  std::vector<std::string> gpu_names;  // parallel to gpus: "0", "1:0", "hostb/2"
  // Parallel to tickets: why each unhealthy candidate fails that ticket's filters, by UUID.
  std::vector<std::map<std::string, std::string>> unhealthy_reasons;
  Plan plan;
  std::vector<std::string> warnings;
  // Where only the head of a long queue was planned (the local backend's acquire: see
  // LocalBackend::plan_head): the requests in the whole queue, the place of each planned one in its
  // order, and the waiters outside the head that may register again (room in the queue now).
  // Empty: the plan covers the whole queue.
  std::size_t queue_length = 0;
  std::vector<std::size_t> place_in_queue;  // parallel to tickets
  std::vector<TicketId> may_enter_beyond_head;
  // Some waiter outside the head was left out of the walk only because a free GPU fails its
  // health filter (see health_dependent()).
  bool unhealthy_beyond_head = false;

  // The place of a request in the whole queue's order (0 first), and the queue's length.
  std::size_t position(std::size_t ticket) const {
    return place_in_queue.empty() ? plan.position_of[ticket] : place_in_queue[ticket];
  }
  std::size_t length() const { return place_in_queue.empty() ? tickets.size() : queue_length; }

  // Index of a GPU by UUID, or -1.
  int gpu_index(const std::string& uuid) const;
  // One line per obstacle of a waiting ticket, and the summary of its standing, for people.
  std::vector<BlockingGpu> blocking(std::size_t ticket) const;
  std::string blocked_by(std::size_t ticket, const Config& config) const;
  bool health_dependent() const;  // some waiter lacks a GPU only because of its health
  // The queue entry at `position` of the plan's order, as `gpulock queue` shows it.
  QueueEntry entry_at(std::size_t position, const Config& config) const;
};

// "leased by alice since 12:03:04 (lease 3f…, 'sweep')".
std::string holder_summary(const HolderRecord& record);

// kTimedOut for a request that is not served now (no wait) or was not within its timeout, with
// why: its standing, each blocking GPU, its place in the queue.
Error not_served(const QueueSnapshot& snapshot, std::size_t me, bool waited,
                 const std::vector<BlockingGpu>& blocking, const std::string& blocked_by);

// Throws kUnsatisfiable when the GPUs `own` (display names), held by the lease the caller runs
// under, leave fewer than `needed` of its `candidates`: waiting for them would never end.
void check_enclosing_lease(const std::vector<std::string>& own, std::size_t candidates,
                           std::size_t needed, const std::string& lease_id);

}  // namespace gpulock
