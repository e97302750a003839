// UsabilityHint: what a queue index slot tells of its request beyond the order, so that a
// planner can pass over a waiter that cannot use any GPU still open without opening its ticket.
//
// A plan reads a waiter's ticket (its candidates and health filters) when the walk reaches it
// while some GPU is still open. When a GPU stays open that none of a long queue can use (a free
// GPU next to a thousand jobs that named another, or one that every job's filters reject because
// a process outside gpulock runs there), every plan would read every ticket: a cost that grows
// with the queue. The hint answers "surely not" for most such waiters from the slot alone:
//   - its candidates as a 40-bit Bloom filter (one bit per UUID): a GPU whose bit is clear is
//     surely not a candidate; a set bit only means "maybe";
//   - whether its only health filter is the check for processes outside gpulock (the default),
//     and whether it allows them: then the planner judges that filter from the device readings.
// Slots written by versions without hints hold zero there: unknown, so the ticket is read. A
// ticket read later must agree with its slot's hint, so a forged hint can only hide a waiter as
// a cleared slot can, until its own next plan (which always uses its own ticket).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "gpulock/device.hpp"
#include "queue/schedule.h"
#include "queue/ticket.h"

namespace gpulock {

struct UsabilityHint {
  bool known = false;               // false: written by a version without hints
  bool foreign_check_only = false;  // no free-memory, utilisation or power filter
  bool allow_foreign = false;       // --allow-foreign
  std::uint64_t candidate_bits = 0;

  static constexpr unsigned kCandidateBits = 40;
  static constexpr std::size_t kStoredSize = 6;

  static UsabilityHint of(const Ticket& ticket);
  // The Bloom filter bit of a GPU's UUID (the same in every process and version).
  static std::uint64_t bit_of(std::string_view uuid);

  // Six bytes of the slot: a byte of flags, then the filter's 40 bits. Unknown flags make the
  // hint unknown rather than the slot invalid.
  std::array<std::uint8_t, kStoredSize> stored() const;
  static UsabilityHint from_stored(const std::array<std::uint8_t, kStoredSize>& bytes);

  // Whether this hint (a slot's) rules out nothing that `exact` (its ticket's) could use: every
  // candidate bit set, and the default filter judged only where the ticket has only it, with
  // --allow-foreign where the ticket has it. A slot that says more than its ticket may come from
  // another version; one that says less could hide its waiter, and its ticket does not count.
  bool admits(const UsabilityHint& exact) const;

  friend bool operator==(const UsabilityHint&, const UsabilityHint&) = default;
};

// The GPUs still claimable after the head of a plan (plan_queue_in_order), judged once, against
// which the waiters behind the head are sieved by their hints: may_claim() is false only for a
// waiter that surely can neither take nor reserve nor hold back any of them. Such a waiter takes
// part in the whole queue's plan as one that waits and claims nothing (GPUs only close as a walk
// goes on), so leaving it out of the walk changes nobody's place or GPUs.
class ClaimSieve {
 public:
  ClaimSieve(const std::vector<ClaimableGpu>& claimable,
             const std::function<const Device*(const std::string&)>& device_of);

  // With `refused_by_health`: set when it is false only because the default filter fails on a
  // free GPU that may be a candidate (the dispatchers then re-read the devices every 2 s, as
  // for a walked request held back by its health).
  bool may_claim(const UsabilityHint& hint, bool shared_request,
                 bool* refused_by_health = nullptr) const;

 private:
  struct Gpu {
    std::uint64_t bit = 0;
    bool whole = false;
    bool shared_use = false;
    // Fails the default filter (processes outside gpulock): [0] without --allow-foreign, [1]
    // with it.
    std::array<bool, 2> fails_default_filter{};
  };
  std::vector<Gpu> gpus_;
  std::uint64_t any_bits_ = 0;
};

}  // namespace gpulock
