// Recording lease starts and ends in the usage journal, and inferring the ends nobody wrote.
#include "journal/lease_journal.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "backend/lease_state.h"
#include "util/current_pid.h"
#include "util/unix_time.h"

namespace gpulock {

void journal_lease_start(LeaseState& lease, std::shared_ptr<UsageJournal> journal,
                         double waited_seconds) noexcept {
  if (!journal) return;
  try {
    JournalRecord r;
    r.kind = JournalRecord::Kind::kStart;
    r.lease_id = lease.id;
    r.time = unix_seconds(lease.started_at);
    r.user = lease.record.user;
    r.uid = lease.record.uid;
    r.host = lease.record.host;
    for (const auto& gpu : lease.gpus)
      r.gpus.push_back(JournalGpu{gpu.uuid, static_cast<int>(gpu.index)});
    r.label = lease.record.label;
    r.command = lease.record.command;
    r.waited_seconds = std::max(0.0, waited_seconds);
    r.memory_bytes = lease.record.memory_bytes.value_or(0);
    journal->append(r);
    lease.journal.journal = std::move(journal);
    lease.journal.owner = current_pid();
  } catch (...) {
    // Out of memory: the lease matters more than its record.
  }
}

void journal_lease_end(LeaseState& lease) noexcept {
  if (!lease.journal.journal || lease.journal.owner != current_pid()) return;
  try {
    JournalRecord r;
    r.kind = JournalRecord::Kind::kEnd;
    r.lease_id = lease.id;
    r.time = unix_seconds(std::chrono::system_clock::now());
    r.end = lease.keeper && lease.keeper->lost() ? LeaseEnd::kLost : LeaseEnd::kReleased;
    r.outcome = lease.outcome;
    lease.journal.journal->append(r);
  } catch (...) {
  }
  lease.journal.owner = 0;
}

void infer_missing_ends(JournalContents& contents, const LiveLeases& live, UsageJournal& journal,
                        double now) {
  std::unordered_map<std::string, bool> ended;
  for (const auto& r : contents.records)
    if (r.kind == JournalRecord::Kind::kEnd) ended[r.lease_id] = true;
  std::vector<JournalRecord> inferred;
  const auto& records = contents.records;  // in time order
  for (std::size_t i = 0; i < records.size(); ++i) {
    const JournalRecord& start = records[i];
    if (start.kind != JournalRecord::Kind::kStart || ended.contains(start.lease_id)) continue;
    if (!live.host.empty() && start.host != live.host) continue;  // another host's to judge
    if (live.lease_ids.contains(start.lease_id)) continue;
    if (std::any_of(start.gpus.begin(), start.gpus.end(),
                    [&](const JournalGpu& g) { return live.unknown_gpus.contains(g.uuid); }))
      continue;
    // The lease is gone. It was gone at the latest when one of its GPUs was leased again by a
    // lease that could not share it: any after a whole-GPU lease, a whole-GPU one after a
    // shared one (shared leases coexist).
    double end = now;
    for (std::size_t j = i + 1; j < records.size(); ++j) {
      const JournalRecord& later = records[j];
      if (later.kind != JournalRecord::Kind::kStart || later.lease_id == start.lease_id) continue;
      if (start.memory_bytes != 0 && later.memory_bytes != 0) continue;
      const bool shares_gpu =
          std::any_of(later.gpus.begin(), later.gpus.end(), [&](const JournalGpu& g) {
            return std::any_of(start.gpus.begin(), start.gpus.end(),
                               [&](const JournalGpu& s) { return s.uuid == g.uuid; });
          });
      if (shares_gpu) {
        end = later.time;
        break;
      }
    }
    JournalRecord r;
    r.kind = JournalRecord::Kind::kEnd;
    r.lease_id = start.lease_id;
    r.time = std::max(std::min(end, now), start.time);
    r.end = LeaseEnd::kHolderDied;
    r.inferred = true;
    journal.append(r);
    ended[start.lease_id] = true;
    inferred.push_back(std::move(r));
  }
  if (inferred.empty()) return;
  contents.records.insert(contents.records.end(), inferred.begin(), inferred.end());
  std::stable_sort(contents.records.begin(), contents.records.end(),
                   [](const JournalRecord& a, const JournalRecord& b) { return a.time < b.time; });
}

}  // namespace gpulock
