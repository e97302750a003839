// Lease counts for the metrics' counters: FileJournal::read_appended() returns each record
// once across readings (rotation, lines still being written), and a follower's counts match
// the whole-journal count, infer holder_died only after two readings without the lease, never
// count an end twice, and believe records by the same rules as pair_journal_records().
#include <gtest/gtest.h>

#include <fstream>

#include "gpulock/usage.hpp"
#include "journal/file_journal.h"
#include "journal/journal_line.h"
#include "journal/lease_counts.h"
#include "temp_dir.h"

namespace gpulock {
namespace {

JournalRecord start(const std::string& id, double time, const std::string& gpu = "G0",
                    unsigned uid = 1000) {
  JournalRecord r;
  r.kind = JournalRecord::Kind::kStart;
  r.lease_id = id;
  r.time = time;
  r.user = "u" + std::to_string(uid);
  r.uid = uid;
  r.host = "node";
  r.gpus.push_back(JournalGpu{gpu, 0});
  r.writer_uid = uid;
  return r;
}

JournalRecord end(const std::string& id, double time, LeaseEnd how = LeaseEnd::kReleased,
                  unsigned writer = 1000, bool inferred = false) {
  JournalRecord r;
  r.kind = JournalRecord::Kind::kEnd;
  r.lease_id = id;
  r.time = time;
  r.end = how;
  r.inferred = inferred;
  r.writer_uid = writer;
  return r;
}

JournalContents batch(std::vector<JournalRecord> records) {
  JournalContents c;
  c.records = std::move(records);
  return c;
}

LiveLeases live_on_node(std::vector<std::string> ids = {}) {
  LiveLeases live;
  live.host = "node";
  live.lease_ids.insert(ids.begin(), ids.end());
  return live;
}

std::uint64_t ended(const LeaseCounts& c, LeaseEnd how, const std::string& user = "u1000") {
  const auto it = c.ended.find({user, how});
  return it == c.ended.end() ? 0 : it->second;
}

TEST(FileJournalReadAppended, EachRecordOnceAcrossRotationAndUnfinishedLines) {
  test_support::TempDir dir("counts");
  const auto path = dir.path() / "j";
  FileJournal journal(path, 2048);
  JournalCursor cursor;
  bool whole = true;
  std::size_t seen = 0;
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 10; ++i) {
      journal.append(start("r" + std::to_string(round) + "-" + std::to_string(i), i));
      journal.append(end("r" + std::to_string(round) + "-" + std::to_string(i), i + 0.5));
    }
    const JournalContents got = journal.read_appended(cursor, whole);
    EXPECT_FALSE(whole);
    EXPECT_TRUE(got.warnings.empty());
    EXPECT_EQ(got.records.size(), 20u) << "round " << round;
    seen += got.records.size();
  }
  EXPECT_EQ(seen, 100u);
  int files = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(path)) ++files;
  EXPECT_GE(files, 3);  // it did rotate
  EXPECT_EQ(journal.read_appended(cursor, whole).records.size(), 0u);

  // A line still being written waits for its end.
  const std::string line = journal_line(start("late", 99));
  std::ofstream out(path / "usage-424242.log", std::ios::app);
  out << line.substr(0, 20) << std::flush;
  EXPECT_EQ(journal.read_appended(cursor, whole).records.size(), 0u);
  out << line.substr(20) << std::flush;
  const JournalContents got = journal.read_appended(cursor, whole);
  ASSERT_EQ(got.records.size(), 1u);
  EXPECT_EQ(got.records[0].lease_id, "late");
}

TEST(LeaseCountFollower, HolderDiedOnlyAfterTwoReadingsWithoutTheLease) {
  LeaseCountFollower::State state;
  state.update(batch({start("a", 1), start("b", 2)}), false, live_on_node({"a", "b"}));
  EXPECT_EQ(state.counts.started["u1000"], 2u);
  state.update(batch({}), false, live_on_node({"a"}));       // b gone once
  state.update(batch({}), false, live_on_node({"a", "b"}));  // back: the count starts over
  state.update(batch({}), false, live_on_node({"a"}));
  EXPECT_EQ(ended(state.counts, LeaseEnd::kHolderDied), 0u);
  state.update(batch({}), false, live_on_node({"a"}));
  EXPECT_EQ(ended(state.counts, LeaseEnd::kHolderDied), 1u);
  // The end another reader infers and writes later is not counted again, nor a late real one.
  state.update(batch({end("b", 3, LeaseEnd::kHolderDied, 0, true), end("b", 4)}), false,
               live_on_node({"a"}));
  state.update(batch({end("a", 5)}), false, live_on_node());
  EXPECT_EQ(ended(state.counts, LeaseEnd::kHolderDied), 1u);
  EXPECT_EQ(ended(state.counts, LeaseEnd::kReleased), 1u);
  // Another host's leases are not this host's to judge.
  JournalRecord elsewhere = start("c", 6);
  elsewhere.host = "other";
  for (int i = 0; i < 3; ++i) state.update(batch({elsewhere}), false, live_on_node());
  EXPECT_EQ(ended(state.counts, LeaseEnd::kHolderDied), 1u);
}

TEST(LeaseCountFollower, EndReadBeforeItsStartWaitsForIt) {
  LeaseCountFollower::State state;
  state.update(batch({end("a", 2)}), false, live_on_node());
  EXPECT_EQ(ended(state.counts, LeaseEnd::kReleased), 0u);
  state.update(batch({start("a", 1)}), false, live_on_node());
  EXPECT_EQ(state.counts.started["u1000"], 1u);
  EXPECT_EQ(ended(state.counts, LeaseEnd::kReleased), 1u);
  EXPECT_TRUE(state.open.empty() && state.orphans.empty());
  // An end whose start never comes is dropped after a few readings: nothing kept for ever.
  state.update(batch({end("gone", 2)}), false, live_on_node());
  for (int i = 0; i < 5; ++i) state.update(batch({}), false, live_on_node());
  EXPECT_TRUE(state.orphans.empty());
}

TEST(LeaseCountFollower, BelievesRecordsLikePairing) {
  LeaseCountFollower::State state;
  JournalRecord claimed = start("x", 1, "G1", 2000);
  claimed.writer_uid = 1000;  // u1000 claims a lease for u2000
  state.update(batch({claimed, start("a", 1), end("a", 2, LeaseEnd::kReleased, 2000)}), false,
               live_on_node({"a"}));
  EXPECT_EQ(state.counts.started.count("u2000"), 0u);
  EXPECT_EQ(ended(state.counts, LeaseEnd::kReleased), 0u);  // not the holder's end
  state.update(batch({end("a", 3, LeaseEnd::kReleased, 0)}), false, live_on_node());  // root's
  EXPECT_EQ(ended(state.counts, LeaseEnd::kReleased), 1u);
}

TEST(LeaseCountFollower, WholeReadingsAgreeWithCountLeasesAndKeepInferredEnds) {
  const std::vector<JournalRecord> records = {start("a", 1), end("a", 2), start("b", 3),
                                              end("b", 4, LeaseEnd::kLost), start("c", 5)};
  LeaseCountFollower::State state;
  LiveLeases pool;  // Redis: the whole pool, no host
  for (int i = 0; i < 4; ++i) {
    state.update(batch(records), true, pool);
    EXPECT_EQ(state.counts.started["u1000"], 3u);
    EXPECT_EQ(ended(state.counts, LeaseEnd::kReleased), 1u);
    EXPECT_EQ(ended(state.counts, LeaseEnd::kLost), 1u);
    // c is gone: counted died from the second reading on, and stays so.
    EXPECT_EQ(ended(state.counts, LeaseEnd::kHolderDied), i == 0 ? 0u : 1u) << i;
  }
  const LeaseCounts once = count_leases(pair_journal_records(records));
  EXPECT_EQ(once.started.at("u1000"), 3u);
  EXPECT_EQ(ended(once, LeaseEnd::kLost), 1u);
  JournalContents missing;
  missing.available = false;
  missing.location = "off";
  state.update(missing, true, pool);
  EXPECT_FALSE(state.counts.available);
  EXPECT_NE(state.counts.problem.find("off"), std::string::npos);
}

}  // namespace
}  // namespace gpulock
