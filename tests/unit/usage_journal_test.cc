// The usage journal's pure parts: records to and from checksummed lines (damage detected),
// pairing starts with ends, GPU-hours and waits per group, time bounds; and FileJournal's
// append, read and rotation in a temporary directory.
#include <gtest/gtest.h>

#include <fstream>

#include "gpulock/error.hpp"
#include "gpulock/usage.hpp"
#include "journal/file_journal.h"
#include "journal/journal_line.h"
#include "journal/lease_journal.h"
#include "temp_dir.h"

namespace gpulock {
namespace {

JournalRecord start(const std::string& id, double time, std::string user,
                    std::vector<std::string> gpus, std::string label = "", double waited = 0) {
  JournalRecord r;
  r.kind = JournalRecord::Kind::kStart;
  r.lease_id = id;
  r.time = time;
  r.user = std::move(user);
  r.uid = 1000;
  r.host = "node";
  int index = 0;
  for (auto& uuid : gpus) r.gpus.push_back(JournalGpu{uuid, index++});
  r.label = std::move(label);
  r.waited_seconds = waited;
  return r;
}

JournalRecord end(const std::string& id, double time, LeaseEnd how = LeaseEnd::kReleased,
                  bool inferred = false) {
  JournalRecord r;
  r.kind = JournalRecord::Kind::kEnd;
  r.lease_id = id;
  r.time = time;
  r.end = how;
  r.inferred = inferred;
  return r;
}

TEST(JournalLine, RoundTripsStartAndEnd) {
  JournalRecord s = start("aaaa", 1000.5, "alice", {"GPU-1", "GPU-2"}, "sweep", 3.25);
  s.command = "python train.py --lr 0.1";
  const std::string line = journal_line(s);
  ASSERT_EQ(line.back(), '\n');
  std::string why;
  const auto back = parse_journal_line(std::string_view(line).substr(0, line.size() - 1), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->lease_id, "aaaa");
  EXPECT_EQ(back->user, "alice");
  ASSERT_EQ(back->gpus.size(), 2u);
  EXPECT_EQ(back->gpus[1].uuid, "GPU-2");
  EXPECT_EQ(back->gpus[1].index, 1);
  EXPECT_EQ(back->command, s.command);
  EXPECT_DOUBLE_EQ(back->waited_seconds, 3.25);

  const std::string e = journal_line(end("aaaa", 2000, LeaseEnd::kLost, true));
  const auto back_end = parse_journal_line(std::string_view(e).substr(0, e.size() - 1), &why);
  ASSERT_TRUE(back_end) << why;
  EXPECT_EQ(back_end->kind, JournalRecord::Kind::kEnd);
  EXPECT_EQ(back_end->end, LeaseEnd::kLost);
  EXPECT_TRUE(back_end->inferred);
}

TEST(JournalLine, CommandOutcomeRoundTripsAndUnknownEndsAreDropped) {
  JournalRecord e = end("cccc", 3000, LeaseEnd::kReleased, false);
  e.outcome = CommandOutcome{CommandEnd::kTimeout, 143, 15};
  const std::string line = journal_line(e);
  std::string why;
  const auto back = parse_journal_line(std::string_view(line).substr(0, line.size() - 1), &why);
  ASSERT_TRUE(back) << why;
  ASSERT_TRUE(back->outcome);
  EXPECT_EQ(back->outcome->how, CommandEnd::kTimeout);
  EXPECT_EQ(back->outcome->exit_status, 143);
  EXPECT_EQ(back->outcome->signal, 15);
  // Without one, none comes back.
  const std::string plain = journal_record_json(end("cccc", 3000, LeaseEnd::kReleased, false));
  EXPECT_EQ(plain.find("command_end"), std::string::npos);
  ASSERT_TRUE(parse_journal_record_json(plain, &why));
  EXPECT_FALSE(parse_journal_record_json(plain, &why)->outcome);
  // Every name reads back as itself.
  for (const CommandEnd how :
       {CommandEnd::kExited, CommandEnd::kSignal, CommandEnd::kTimeout, CommandEnd::kCancelled,
        CommandEnd::kOverMemory, CommandEnd::kLeaseLost})
    EXPECT_EQ(command_end_named(command_end_name(how)), how);
  // A later gpulock's end this one does not know: the record stands, the command's end goes.
  const std::string base = R"({"v":1,"event":"end","lease_id":"cccc","time":5,"how":"released",)";
  const auto future = parse_journal_record_json(
      base + R"("command_end":"oom","exit_status":137,"signal":9})", &why);
  ASSERT_TRUE(future) << why;
  EXPECT_FALSE(future->outcome);
  // Values out of range or of the wrong type are damage.
  for (const char* bad : {R"("command_end":"exited","exit_status":256,"signal":0})",
                          R"("command_end":"exited","exit_status":-1,"signal":0})",
                          R"("command_end":"signal","exit_status":137,"signal":65})",
                          R"("command_end":"exited","exit_status":"0","signal":0})",
                          R"("command_end":"exited","signal":0})", R"("command_end":3})"})
    EXPECT_FALSE(parse_journal_record_json(base + bad, &why)) << bad;
}

TEST(JournalLine, DetectsEveryKindOfDamage) {
  std::string line = journal_line(start("bbbb", 5, "bob", {"GPU-1"}));
  line.pop_back();
  std::string why;
  for (std::size_t i = 0; i < line.size(); i += 7) {  // any byte changed
    std::string damaged = line;
    damaged[i] = static_cast<char>(damaged[i] ^ 0x04);
    EXPECT_FALSE(parse_journal_line(damaged, &why)) << i;
  }
  for (std::size_t cut = 0; cut < line.size(); cut += 5)  // any truncation
    EXPECT_FALSE(parse_journal_line(line.substr(0, cut), &why)) << cut;
  EXPECT_FALSE(parse_journal_line("", &why));
  EXPECT_FALSE(parse_journal_line("hello world, not a record", &why));
}

TEST(JournalLine, ValidChecksumButBadFieldsIsRejected) {
  std::string why;
  EXPECT_FALSE(
      parse_journal_record_json(R"({"v":1,"event":"start","lease_id":"x","time":1})", &why));
  EXPECT_FALSE(parse_journal_record_json(
      R"({"v":1,"event":"end","lease_id":"x","time":-5,"how":"released"})", &why));
  EXPECT_FALSE(parse_journal_record_json(
      R"({"v":1,"event":"end","lease_id":"x","time":5,"how":"exploded"})", &why));
  EXPECT_FALSE(parse_journal_record_json(R"({"v":2,"event":"end"})", &why));
  EXPECT_FALSE(parse_journal_record_json("[1,2]", &why));
}

TEST(JournalLine, ControlCharactersQuotesAndInvalidUtf8RoundTrip) {
  JournalRecord s = start("dddd", 5, "dave", {"GPU-1"});
  s.command = std::string("say \"hi\"\\ \n\t\x1b[31m \xff\xfe caf\xc3\xa9 \xe2\x82");
  s.label = "\xc3";  // a cut multi-byte character
  const std::string line = journal_line(s);
  std::string why;
  const auto back = parse_journal_line(std::string_view(line).substr(0, line.size() - 1), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->command, "say \"hi\"\\ \n\t\x1b[31m ?? caf\xc3\xa9 ??");
  EXPECT_EQ(back->label, "?");
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
}

TEST(JournalLine, LongCommandsAreCutToFitOneLine) {
  JournalRecord s = start("cccc", 5, "carol", {"GPU-1"});
  s.command = std::string(100000, 'x');
  s.label = std::string(10000, 'y');
  const std::string line = journal_line(s);
  EXPECT_LE(line.size(), kMaxJournalLine);
  std::string why;
  EXPECT_TRUE(parse_journal_line(std::string_view(line).substr(0, line.size() - 1), &why)) << why;
}

TEST(UsagePairing, FirstWrittenEndWinsAndWrittenBeatsInferred) {
  const auto leases =
      pair_journal_records({start("a", 0, "u", {"G"}), end("a", 50, LeaseEnd::kHolderDied, true),
                            end("a", 40), end("a", 45), end("orphan", 9)});
  ASSERT_EQ(leases.size(), 1u);
  EXPECT_DOUBLE_EQ(*leases[0].ended_at, 40);
  EXPECT_EQ(*leases[0].end, LeaseEnd::kReleased);
  EXPECT_FALSE(leases[0].end_inferred);
}

TEST(UsagePairing, NobodyClaimsOrEndsAnothersLease) {
  auto real = start("a", 0, "alice", {"G"});
  real.writer_uid = 1000;  // alice's own file
  auto forged_start = start("f", 0, "alice", {"G"});
  forged_start.writer_uid = 2000;  // bob claims a lease for alice
  auto forged_end = end("a", 10);
  forged_end.writer_uid = 2000;  // bob ends alice's lease early
  auto real_end = end("a", 100);
  real_end.writer_uid = 1000;
  const auto leases = pair_journal_records({real, forged_start, forged_end, real_end});
  ASSERT_EQ(leases.size(), 1u);
  EXPECT_EQ(leases[0].start.lease_id, "a");
  EXPECT_DOUBLE_EQ(*leases[0].ended_at, 100);
  // Root's records count for anyone (`gpulock init`, an administrator's repair).
  auto root_end = end("a", 50);
  root_end.writer_uid = 0;
  EXPECT_DOUBLE_EQ(*pair_journal_records({real, root_end, real_end})[0].ended_at, 50);
}

TEST(UsageSummary, GpuHoursWaitsAndWindow) {
  const std::vector<JournalRecord> records = {
      start("a", 0, "alice", {"G0", "G1"}, "x", 10), end("a", 3600),  // 2 GPU-hours
      start("b", 1800, "bob", {"G2"}, "", 30),       end("b", 5400),  // 1 GPU-hour
      start("c", 7200, "alice", {"G0"}, "x", 20),                     // running
  };
  const auto leases = pair_journal_records(records);
  const UsageReport all = summarize_usage(leases, 0, 10800, UsageGrouping::kUser, 9000);
  ASSERT_EQ(all.groups.size(), 2u);
  EXPECT_EQ(all.groups[0].key, "alice");
  EXPECT_NEAR(all.groups[0].gpu_hours, 2.5, 1e-9);  // c counts until now (9000)
  EXPECT_EQ(all.groups[0].leases, 2u);
  EXPECT_DOUBLE_EQ(all.groups[0].median_wait_seconds, 15);
  EXPECT_DOUBLE_EQ(all.groups[0].max_wait_seconds, 20);
  EXPECT_NEAR(all.total.gpu_hours, 3.5, 1e-9);
  EXPECT_EQ(all.total.leases, 3u);
  EXPECT_DOUBLE_EQ(all.total.median_wait_seconds, 20);

  // Only the overlap with the window counts.
  const UsageReport part = summarize_usage(leases, 1800, 3600, UsageGrouping::kGpu, 9000);
  EXPECT_NEAR(part.total.gpu_hours, 1.5, 1e-9);  // a: 2 GPUs x 0.5 h, b: 0.5 h
  ASSERT_EQ(part.groups.size(), 3u);
  for (const auto& g : part.groups) EXPECT_NEAR(g.gpu_hours, 0.5, 1e-9) << g.key;

  const UsageReport labels = summarize_usage(leases, 0, 10800, UsageGrouping::kLabel, 9000);
  ASSERT_EQ(labels.groups.size(), 2u);
  EXPECT_EQ(labels.groups[0].key, "x");
  EXPECT_EQ(labels.groups[1].key, "");

  const UsageReport late = summarize_usage(leases, 20000, 30000, UsageGrouping::kUser, 40000);
  EXPECT_NEAR(late.total.gpu_hours, 10000 / 3600.0, 1e-9);  // only c, still running
  EXPECT_EQ(late.total.leases, 1u);
}

TEST(UsageSummary, ByJobReadsTheJobIdOfTheLabel) {
  const std::vector<JournalRecord> records = {
      start("a", 0, "alice", {"G0"}, "job 56 slice", 0), end("a", 3600),
      start("b", 0, "alice", {"G1"}, "job 56 slice", 0), end("b", 1800),  // a resubmit's twin
      start("c", 0, "bob", {"G2"}, "job 7", 0),          end("c", 3600),
      start("d", 0, "bob", {"G3"}, "jobless", 0),        end("d", 3600),
      start("e", 0, "bob", {"G4"}, "job 8x", 0),         end("e", 3600),
  };
  const UsageReport report =
      summarize_usage(pair_journal_records(records), 0, 7200, UsageGrouping::kJob, 9000);
  ASSERT_EQ(report.groups.size(), 3u);
  EXPECT_EQ(report.groups[0].key, "");  // d and e: 2 GPU-hours of no job
  EXPECT_NEAR(report.groups[0].gpu_hours, 2, 1e-9);
  EXPECT_EQ(report.groups[1].key, "56");
  EXPECT_NEAR(report.groups[1].gpu_hours, 1.5, 1e-9);
  EXPECT_EQ(report.groups[1].leases, 2u);
  EXPECT_EQ(report.groups[2].key, "7");
  EXPECT_STREQ(usage_grouping_name(UsageGrouping::kJob), "job");
}

TEST(UsageSummary, GroupingsAreNamedBothWays) {
  for (const UsageGrouping grouping :
       {UsageGrouping::kUser, UsageGrouping::kGpu, UsageGrouping::kLabel, UsageGrouping::kDay,
        UsageGrouping::kJob})
    EXPECT_EQ(usage_grouping_named(usage_grouping_name(grouping)), grouping);
  EXPECT_FALSE(usage_grouping_named("host").has_value());
  EXPECT_FALSE(usage_grouping_named("").has_value());
}

TEST(UsageSummary, DaysSplitAtUtcMidnight) {
  const double midnight = 86400.0 * 20000;  // a UTC midnight
  const auto leases =
      pair_journal_records({start("a", midnight - 1800, "u", {"G"}), end("a", midnight + 3600)});
  const UsageReport days =
      summarize_usage(leases, midnight - 86400, midnight + 86400, UsageGrouping::kDay, 1e10);
  ASSERT_EQ(days.groups.size(), 2u);
  EXPECT_NEAR(days.groups[0].gpu_hours, 0.5, 1e-9);
  EXPECT_NEAR(days.groups[1].gpu_hours, 1.0, 1e-9);
  EXPECT_LT(days.groups[0].key, days.groups[1].key);
  EXPECT_EQ(days.total.leases, 1u);
}

TEST(TimeBounds, DurationsDatesAndErrors) {
  EXPECT_DOUBLE_EQ(parse_time_bound("7d", 1e6), 1e6 - 7 * 86400);
  EXPECT_DOUBLE_EQ(parse_time_bound("12h", 1e6), 1e6 - 12 * 3600);
  EXPECT_DOUBLE_EQ(parse_time_bound("30m", 1e6), 1e6 - 1800);
  EXPECT_DOUBLE_EQ(parse_time_bound("2026-11-01", 0), 1793491200);
  EXPECT_DOUBLE_EQ(parse_time_bound("2026-11-01T08:00", 0), 1793491200 + 8 * 3600);
  EXPECT_DOUBLE_EQ(parse_time_bound("1234.5", 0), 1234.5);
  for (const char* bad : {"", "7x", "d", "yesterday", "2026-13-01", "2026-11-01Tnope", "1e400d"})
    EXPECT_THROW(parse_time_bound(bad, 1e6), Error) << bad;
}

TEST(InferredEnds, GoneLeasesEndAtTheNextStartOnTheirGpus) {
  test_support::TempDir dir("journal");
  FileJournal journal(dir.path() / "j", 1 << 20);
  JournalContents contents;
  contents.records = {start("dead", 10, "u", {"G0"}), start("next", 50, "v", {"G0"}),
                      start("alive", 60, "w", {"G1"}), start("dark", 70, "w", {"G2"}),
                      start("far", 80, "w", {"G3"})};
  contents.records[4].host = "elsewhere";
  LiveLeases live;
  live.host = "node";
  live.lease_ids = {"next", "alive"};
  live.unknown_gpus = {"G2"};
  infer_missing_ends(contents, live, journal, 100);
  const auto leases = pair_journal_records(contents.records);
  for (const auto& lease : leases) {
    if (lease.start.lease_id == "dead") {
      ASSERT_TRUE(lease.ended_at);
      EXPECT_DOUBLE_EQ(*lease.ended_at, 50);
      EXPECT_EQ(*lease.end, LeaseEnd::kHolderDied);
      EXPECT_TRUE(lease.end_inferred);
    } else {
      EXPECT_FALSE(lease.ended_at) << lease.start.lease_id;
    }
  }
  // The inferred end was written for the next reader.
  const JournalContents again = journal.read();
  ASSERT_EQ(again.records.size(), 1u);
  EXPECT_EQ(again.records[0].lease_id, "dead");
}

TEST(InferredEnds, ASharedLeaseIsNotEndedByAnotherSharedLeaseStarting) {
  test_support::TempDir dir("journal");
  FileJournal journal(dir.path() / "j", 1 << 20);
  JournalContents contents;
  // Two shared leases on G0: the second began while the first ran; a whole-GPU lease at 90
  // could start only once both had gone.
  contents.records = {start("shared-dead", 10, "u", {"G0"}), start("shared-alive", 20, "v", {"G0"}),
                      start("whole", 90, "w", {"G0"})};
  contents.records[0].memory_bytes = contents.records[1].memory_bytes = 8ull << 30;
  LiveLeases live;
  live.host = "node";
  live.lease_ids = {"shared-alive", "whole"};
  infer_missing_ends(contents, live, journal, 100);
  for (const auto& lease : pair_journal_records(contents.records))
    if (lease.start.lease_id == "shared-dead") {
      ASSERT_TRUE(lease.ended_at);
      EXPECT_DOUBLE_EQ(*lease.ended_at, 90);  // not 20
    }
  // The reservation round-trips through a line; a whole-GPU start has none.
  std::string why;
  const std::string line = journal_line(contents.records[0]);
  const auto back = parse_journal_line(std::string_view(line).substr(0, line.size() - 1), &why);
  ASSERT_TRUE(back) << why;
  EXPECT_EQ(back->memory_bytes, 8ull << 30);
  EXPECT_EQ(journal_record_json(contents.records[2]).find("memory_bytes"), std::string::npos);
}

TEST(FileJournal, AppendsReadsSkipsDamageAndRotates) {
  test_support::TempDir dir("journal");
  const auto path = dir.path() / "j";
  {
    FileJournal journal(path, 2048);
    for (int i = 0; i < 40; ++i) {
      journal.append(start("id" + std::to_string(i), i, "u", {"G0"}, std::string(50, 'l')));
      journal.append(end("id" + std::to_string(i), i + 0.5));
    }
  }
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    ++files;
    EXPECT_LE(std::filesystem::file_size(entry.path()), 2048u + kMaxJournalLine);
  }
  EXPECT_GE(files, 3);
  FileJournal reader(path, 2048);
  JournalContents contents = reader.read();
  EXPECT_TRUE(contents.warnings.empty());
  ASSERT_EQ(contents.records.size(), 80u);
  EXPECT_EQ(pair_journal_records(contents.records).size(), 40u);

  // Garbage in the middle of a file is skipped alone.
  std::ofstream(path / "usage-424242.log")
      << "garbage\n"
      << journal_line(start("z", 1, "u", {"G"})) << "{\"v\":1}\n";
  contents = reader.read();
  EXPECT_EQ(contents.records.size(), 81u);
  EXPECT_EQ(contents.warnings.size(), 2u);
}

TEST(FileJournal, MissingUnmakeableDirectoryIsSilentlyOff) {
  // Under /proc nobody, root included, can make a directory: as /var/lib is for a user.
  FileJournal journal("/proc/gpulock-no-such-dir/journal", 1 << 20);
  testing::internal::CaptureStderr();
  journal.append(start("a", 1, "u", {"G"}));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_FALSE(journal.read().available);
}

TEST(FileJournal, MissingParentsAreMadeWhereTheyCanBe) {
  test_support::TempDir dir("journal");
  FileJournal journal(dir.path() / "var" / "lib" / "gpulock" / "journal", 1 << 20);
  journal.append(start("a", 1, "u", {"G"}));
  const JournalContents contents = journal.read();
  EXPECT_TRUE(contents.available);
  EXPECT_EQ(contents.records.size(), 1u);
}

}  // namespace
}  // namespace gpulock
