// LeaseState: what a granted lease is, whichever backend keeps it (the state behind a Lease).
//
// Backends fill it in when they grant a lease; Lease (include/gpulock/lease.hpp) owns it. The
// backend's own part is the keeper.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/holder_record.h"
#include "backend/lease_keeper.h"
#include "gpulock/lease.hpp"
#include "journal/lease_journal.h"

namespace gpulock {

struct LeaseState {
  std::string id;
  std::vector<LeasedGpu> gpus;
  std::chrono::system_clock::time_point started_at;
  // Who holds the lease, as others see it; the keeper publishes it after each change.
  HolderRecord record;
  std::unique_ptr<LeaseKeeper> keeper;
  // The usage journal's end record, owed by one process (journal/lease_journal.h).
  LeaseJournalDebt journal;
  // How the command run under the lease ended, for that end record (Lease::set_outcome()).
  std::optional<CommandOutcome> outcome;

  // Writes the journal's end record if this process owes it. A keeper that does not belong to
  // this process (a forked copy) is left alone, not destroyed.
  ~LeaseState();
};

}  // namespace gpulock
