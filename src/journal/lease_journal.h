// The usage journal's part in a lease's life: its start is recorded when it is granted, and its
// end by the process that owes it (the one that acquired, or the detached holder it handed the
// lease to) when that process lets the lease go.
//
// A forked copy of a Lease (Python's multiprocessing, a C fork) owes nothing: only the process
// recorded as the owner writes the end. An end that no process wrote (SIGKILL of everything) is
// inferred later by a reader of the journal (infer_missing_ends()).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <unordered_set>

#include "journal/usage_journal.h"

namespace gpulock {

struct LeaseState;

// What a lease owes the journal.
struct LeaseJournalDebt {
  std::shared_ptr<UsageJournal> journal;
  pid_t owner = 0;  // the process that writes the end; 0: nobody here
};

void journal_lease_start(LeaseState& lease, std::shared_ptr<UsageJournal> journal,
                         double waited_seconds) noexcept;
// Writes the end ("released", or "lost" for a lease its keeper lost) if this process owes it.
void journal_lease_end(LeaseState& lease) noexcept;

// What a reader knows of the leases that run now, to tell a start without an end that still
// runs from one whose holder died.
struct LiveLeases {
  std::unordered_set<std::string> lease_ids;
  // GPUs leased by someone whose record cannot be read: a lease on one of them may be alive.
  std::unordered_set<std::string> unknown_gpus;
  std::string host;  // "" where `lease_ids` covers every host (Redis: the whole pool)
};

// For every start without an end whose lease is not live, appends an inferred "holder_died"
// end to the journal and to `contents`: at the next start of a lease on one of its GPUs if
// the journal has one (the GPU was free again by then), else at `now`.
void infer_missing_ends(JournalContents& contents, const LiveLeases& live, UsageJournal& journal,
                        double now);

}  // namespace gpulock
