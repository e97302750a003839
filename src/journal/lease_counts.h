// Lease counts for the metrics' counters: from the whole journal at once (count_leases(), in
// gpulock/usage.hpp), or kept up to date from what the journal gains (LeaseCountFollower's
// state, fed by GpuPool::follow_lease_counts()).
#pragma once

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gpulock/usage.hpp"
#include "journal/lease_journal.h"
#include "journal/usage_journal.h"

namespace gpulock {

// Why there are no counts where the journal is missing ("off", or a directory not set up).
std::string journal_missing_problem(const std::string& location);

struct LeaseCountFollower::State {
  struct Open {
    std::string user;
    unsigned uid = 0;
    std::string host;
    std::vector<std::string> gpu_uuids;
    unsigned readings_not_held = 0;
  };
  struct Orphan {
    JournalRecord end;
    unsigned readings = 0;
  };
  JournalCursor cursor;
  LeaseCounts counts;
  std::unordered_map<std::string, Open> open;       // started, not yet ended
  std::unordered_map<std::string, Orphan> orphans;  // ends read before their start
  // Read whole each time (Redis): the leases this follower counted as died, still without an end.
  std::unordered_set<std::string> counted_died;

  // Adds what the journal gained (`appended`; everything kept when `whole`, then the counts
  // start afresh), then counts as "holder_died" the open leases not in `live` at two readings in
  // a row.
  void update(const JournalContents& appended, bool whole, const LiveLeases& live);
};

}  // namespace gpulock
