// QueueIndex: the queue's compact table of waiting requests, one fixed-size slot each, in one
// file ("<lock dir>/queue/index"), so that planning reads the whole queue with one pread instead
// of opening, checking and parsing a ticket file per waiter.
//
// A slot holds what ordering the queue needs (arrival, user, process, priority, size, flags, and
// a shared request's memory units or slots), a hint of which GPUs it could use (UsabilityHint),
// and the id of the waiter's ticket file, which stays the truth: a slot counts only while its
// ticket is live (QueueDirectory). Planners read a ticket's details and check its liveness only
// when the plan reaches it while some GPU is still free (see plan_queue's loader), so the cost
// of a plan does not grow with the number of waiters behind the last free GPU.
//
// Slots are written under the machine-wide acquire mutex (registration, and clearing the slot of
// a waiter found dead); a waiter clears its own slot when it leaves. The file is world-writable
// like the queue directory: everything read from it is untrusted and validated, and a forged or
// damaged slot can only change the order of service, never exclusion (the GPU locks decide).
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "gpulock/queue.hpp"
#include "local/usability_hint.h"
#include "queue/ticket_id.h"
#include "util/fd.h"

namespace gpulock {

class LockDirectory;
struct StoredIndexSlot;

struct IndexEntry {
  IndexEntry() = default;
  // A slot as the index stores it, checked by the reader, at place `slot_number`.
  IndexEntry(const StoredIndexSlot& raw, std::uint32_t slot_number);

  std::uint32_t slot = 0;
  std::uint64_t seq = 0;  // arrival order, > 0
  TicketId id;            // the ticket's id (16 hex digits)
  uid_t uid = 0;          // as registered; the ticket file's owner is checked when it is read
  pid_t pid = 0;
  std::uint64_t pid_start = 0;  // the process's start time, against pid reuse
  Priority priority = Priority::kNormal;
  unsigned needed = 1;
  bool named_gpus = false;
  bool entered_over_limit = false;
  // A shared request's memory units per GPU, or slots (see Ticket); 0 for whole GPUs.
  std::uint32_t shared_units = 0;
  std::uint32_t shared_slots = 0;
  // Its candidates and health filters in brief, to pass it over without reading its ticket
  // when no GPU still claimable could serve it (unknown in slots of versions before hints). As
  // the slot stores it, decoded on demand: most plans never look at it.
  std::array<std::uint8_t, UsabilityHint::kStoredSize> stored_hint{};
  UsabilityHint hint() const { return UsabilityHint::from_stored(stored_hint); }
};

class QueueIndex {
 public:
  // Opens the index file of the queue directory `dir`, creating it (mode 0666) when missing.
  // Throws Error(kEnvironment) when it cannot be used.
  explicit QueueIndex(const LockDirectory& dir);
  static constexpr const char* kFileName = "index";

  struct Contents {
    std::vector<IndexEntry> entries;  // valid occupied slots, by seq
    std::uint64_t next_seq = 1;       // the seq the next registration gets
    std::uint32_t first_free = 0;     // the first slot that add() may use
  };
  // The whole table, read with one pread (a few more for a queue of thousands).
  Contents read() const;

  // Writes `entry` into the first free slot (entry.slot is set) and returns it with its seq,
  // which is `contents.next_seq`. REQUIRES: the acquire mutex is held and `contents` was read
  // under it. Throws Error(kEnvironment) when the file cannot be written (a full disk).
  IndexEntry add(IndexEntry entry, const Contents& contents);

  // Empties the slot if it still holds that seq. Safe without the mutex for one's own slot.
  void remove(std::uint32_t slot, std::uint64_t seq) const;

 private:
  UniqueFd fd_;
};

}  // namespace gpulock
