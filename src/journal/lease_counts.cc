// Lease counts (journal/lease_counts.h): the same rules as pair_journal_records() for whose
// records are believed, applied once over the whole journal or as records arrive.
#include "journal/lease_counts.h"

#include <algorithm>

namespace gpulock {
namespace {

// An orphan end waits this many readings for its start (written in another file, read in
// the same pass before it was appended); then it is dropped: its start rotated away.
constexpr unsigned kOrphanReadings = 3;
// An open lease must be missing from this many readings in a row to count as holder_died: its
// holder may have let the lock go and not yet written the end.
constexpr unsigned kReadingsBeforeDied = 2;

bool written_by(const JournalRecord& r, unsigned uid) {
  return !r.writer_uid || *r.writer_uid == uid || *r.writer_uid == 0;
}

}  // namespace

std::string journal_missing_problem(const std::string& location) {
  if (location == "off") return "the usage journal is off (journal_dir or GPULOCK_JOURNAL_DIR)";
  return "no usage journal at " + location + " (`gpulock init` makes it)";
}

LeaseCounts count_leases(const std::vector<UsageLease>& leases) {
  LeaseCounts counts;
  counts.available = true;
  for (const auto& lease : leases) {
    ++counts.started[lease.start.user];
    if (lease.end) ++counts.ended[{lease.start.user, *lease.end}];
  }
  return counts;
}

LeaseCountFollower::LeaseCountFollower() : state_(std::make_unique<State>()) {}
LeaseCountFollower::~LeaseCountFollower() = default;
const LeaseCounts& LeaseCountFollower::counts() const {
  return state_->counts;
}

void LeaseCountFollower::State::update(const JournalContents& appended, bool whole,
                                       const LiveLeases& live) {
  if (!appended.available) {
    counts.available = false;
    counts.problem = journal_missing_problem(appended.location);
    return;
  }
  // Everything again (Redis): count afresh, but remember how long open leases were missing and
  // which this follower counted as died, or every reading would start their wait over.
  std::unordered_map<std::string, unsigned> missing;
  if (whole) {
    for (const auto& [id, lease] : open) missing[id] = lease.readings_not_held;
    for (const auto& id : counted_died) missing[id] = kReadingsBeforeDied;
    counts = LeaseCounts{};
    open.clear();
    orphans.clear();
    counted_died.clear();
  }
  counts.available = true;
  counts.problem.clear();

  std::vector<JournalRecord> records;
  records.reserve(orphans.size() + appended.records.size());
  for (const auto& entry : orphans) records.push_back(entry.second.end);
  records.insert(records.end(), appended.records.begin(), appended.records.end());
  std::stable_sort(records.begin(), records.end(),
                   [](const JournalRecord& a, const JournalRecord& b) { return a.time < b.time; });
  // Starts first, so that an end ordered before its start (clocks of two hosts) still finds it.
  for (const auto& r : records) {
    if (r.kind != JournalRecord::Kind::kStart || !written_by(r, r.uid)) continue;
    auto [it, fresh] = open.try_emplace(r.lease_id);
    if (!fresh) continue;  // the same start read twice
    Open& lease = it->second;
    if (const auto m = missing.find(r.lease_id); m != missing.end())
      lease.readings_not_held = m->second;
    lease.user = r.user;
    lease.uid = r.uid;
    lease.host = r.host;
    for (const auto& g : r.gpus) lease.gpu_uuids.push_back(g.uuid);
    ++counts.started[r.user];
  }
  std::unordered_map<std::string, Orphan> waiting;
  for (const auto& r : records) {
    if (r.kind != JournalRecord::Kind::kEnd) continue;
    const auto it = open.find(r.lease_id);
    if (it == open.end()) {
      const auto before = orphans.find(r.lease_id);
      const unsigned readings = before == orphans.end() ? 1 : before->second.readings + 1;
      if (readings < kOrphanReadings) waiting.try_emplace(r.lease_id, Orphan{r, readings});
      continue;
    }
    if (!r.inferred && !written_by(r, it->second.uid)) continue;  // not the holder's to write
    ++counts.ended[{it->second.user, r.end}];
    open.erase(it);
  }
  orphans = std::move(waiting);

  for (auto it = open.begin(); it != open.end();) {
    Open& lease = it->second;
    const bool judged_elsewhere = !live.host.empty() && lease.host != live.host;
    const bool maybe_held =
        live.lease_ids.contains(it->first) ||
        std::any_of(lease.gpu_uuids.begin(), lease.gpu_uuids.end(),
                    [&](const std::string& uuid) { return live.unknown_gpus.contains(uuid); });
    if (judged_elsewhere || maybe_held) {
      lease.readings_not_held = 0;
      ++it;
      continue;
    }
    if (++lease.readings_not_held < kReadingsBeforeDied) {
      ++it;
      continue;
    }
    ++counts.ended[{lease.user, LeaseEnd::kHolderDied}];
    if (whole) counted_died.insert(it->first);
    it = open.erase(it);
  }
}

}  // namespace gpulock
