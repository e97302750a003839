// JobStore: records made, listed and read back; a lock nobody holds makes an unfinished job
// lost; malformed and planted entries are reported without hiding the others.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "gpulock/error.hpp"
#include "gpulock/jobs.hpp"

namespace gpulock {
namespace {

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gpulock-job-store-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static JobSpec spec(const std::string& name) {
    JobSpec s;
    s.name = name;
    s.lease_options = {"--count=1"};
    s.command = {"echo", "hi"};
    s.working_directory = "/";
    s.submitted_unix = 1700000000;
    return s;
  }

  std::filesystem::path dir_;
};

TEST_F(JobStoreTest, CreatesASharedStickyRootAndNumbersJobsInOrder) {
  const JobStore store = JobStore::open(dir_ / "jobs");
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "jobs").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);
  auto a = store.create(spec("a"), false);
  auto b = store.create(spec("b"), true);
  EXPECT_EQ(a.id, 1u);
  EXPECT_EQ(b.id, 2u);
  ASSERT_EQ(::stat((b.directory / "stdout").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  ASSERT_EQ(::stat((a.directory / "stdout").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // Held by this process's descriptors: the jobs wait, as a supervisor would show them.
  const auto jobs = store.list();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].spec.name, "a");
  EXPECT_EQ(jobs[0].spec.command, (std::vector<std::string>{"echo", "hi"}));
  EXPECT_EQ(jobs[0].progress.state, JobState::kWaiting);
  EXPECT_EQ(jobs[0].owner, ::geteuid());

  // Its lock let go without an end recorded: lost, even while someone holds a read lock (as
  // `gpulock wait` does, or a user who wants a dead job to look alive). With an end recorded:
  // that end.
  ::close(a.lock_fd);
  const int reader = ::open((a.directory / "lock").c_str(), O_RDONLY | O_CLOEXEC);
  struct flock shared {};
  shared.l_type = F_RDLCK;
  shared.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(reader, F_OFD_SETLK, &shared), 0);
  EXPECT_EQ(store.find(1)->progress.state, JobState::kLost);
  ::close(reader);
  JobProgress done;
  done.state = JobState::kDone;
  done.exit_status = 0;
  write_job_progress(b.directory, done);
  ::close(b.lock_fd);
  EXPECT_EQ(store.find(2)->progress.state, JobState::kDone);
  EXPECT_EQ(store.wait(2).progress.exit_status, 0);
  EXPECT_FALSE(store.find(3).has_value());

  // The lost one and the done one; an unreadable one made just now is left alone.
  std::filesystem::create_directory(dir_ / "jobs" / "9");
  EXPECT_EQ(store.clean(), 2u);
  std::filesystem::remove(dir_ / "jobs" / "9");
  EXPECT_TRUE(store.list().empty());
  // Ids go on from the highest ever given: never twice, even after a clean.
  auto c = store.create(spec("c"), false);
  EXPECT_EQ(c.id, 3u);
  ::close(c.lock_fd);
}

TEST_F(JobStoreTest, MalformedAndPlantedEntriesAreReportedNotFatal) {
  const JobStore store = JobStore::open(dir_ / "jobs");
  auto good = store.create(spec("good"), false);
  std::filesystem::create_directory(dir_ / "jobs" / "2");
  std::ofstream(dir_ / "jobs" / "2" / "job.json") << "[1, 2";
  std::filesystem::create_directory(dir_ / "elsewhere");
  std::filesystem::create_directory_symlink(dir_ / "elsewhere", dir_ / "jobs" / "3");
  std::ofstream(dir_ / "jobs" / "007") << "not a job id";
  const auto jobs = store.list();
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_TRUE(jobs[0].problem.empty());
  EXPECT_NE(jobs[1].problem.find("malformed"), std::string::npos) << jobs[1].problem;
  EXPECT_NE(jobs[2].problem.find("symlink"), std::string::npos) << jobs[2].problem;
  EXPECT_EQ(store.create(spec("next"), false).id, 4u);
  ::close(good.lock_fd);
}

TEST_F(JobStoreTest, StateFilesPlantedOrFromAnEarlierVersion) {
  const JobStore store = JobStore::open(dir_ / "jobs");
  auto a = store.create(spec("a"), false);
  auto b = store.create(spec("b"), false);
  ::close(a.lock_fd);
  ::close(b.lock_fd);
  // A job of an earlier gpulock: its state.json is read where it has no state file.
  std::filesystem::remove(a.directory / "state");
  std::ofstream(a.directory / "state.json")
      << R"({"state":"done","supervisor_pid":1,"started":1,"ended":2,"lease_id":"",)"
      << R"("gpus":["0"],"reason":"exited 0","exit_status":0})";
  // A state file replaced by a symlink to someone else's record: refused, not followed.
  std::filesystem::remove(b.directory / "state");
  std::filesystem::create_symlink(a.directory / "state.json", b.directory / "state");
  const auto jobs = store.list();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_TRUE(jobs[0].problem.empty()) << jobs[0].problem;
  EXPECT_EQ(jobs[0].progress.state, JobState::kDone);
  EXPECT_EQ(jobs[0].progress.exit_status, 0);
  EXPECT_NE(jobs[1].problem.find("state"), std::string::npos) << jobs[1].problem;
}

TEST_F(JobStoreTest, ACommandThatIsNotUtf8IsRefusedAndLeavesNothing) {
  const JobStore store = JobStore::open(dir_ / "jobs");
  JobSpec bad = spec("bad");
  bad.command = {"echo", "caf\xe9"};
  EXPECT_THROW(store.create(bad, false), Error);
  bad = spec("bad");
  bad.working_directory = "/tmp/\xff";
  EXPECT_THROW(store.create(bad, false), Error);
  EXPECT_TRUE(store.list().empty());
  JobSpec long_reason = spec("fine");
  auto c = store.create(long_reason, false);
  // A reason longer than a state slot is cut, never refused: the end is always recorded.
  JobProgress ended;
  ended.state = JobState::kFailed;
  ended.reason = std::string(10000, 'r');
  write_job_progress(c.directory, ended);
  ::close(c.lock_fd);
  const auto found = store.find(c.id);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->progress.state, JobState::kFailed);
  EXPECT_LT(found->progress.reason.size(), 4000u);
}

TEST_F(JobStoreTest, RefusesASymlinkedRootAndAnUnstickyShared) {
  std::filesystem::create_directory(dir_ / "real");
  std::filesystem::create_directory_symlink(dir_ / "real", dir_ / "link");
  EXPECT_THROW(JobStore::open(dir_ / "link"), Error);
  std::filesystem::create_directory(dir_ / "open");
  ::chmod((dir_ / "open").c_str(), 0777);
  try {
    JobStore::open(dir_ / "open");
    FAIL() << "a world-writable store without the sticky bit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not sticky"), std::string::npos) << e.what();
  }
}

TEST(JobStateNames, RoundTrip) {
  for (const auto state :
       {JobState::kWaiting, JobState::kRunning, JobState::kDone, JobState::kFailed,
        JobState::kCancelled, JobState::kTimeout, JobState::kLost})
    EXPECT_EQ(job_state_from_name(job_state_name(state)), state);
  EXPECT_FALSE(job_state_from_name("asleep").has_value());
}

TEST(JobLeaseLabel, NamesTheJobAndReadsItBack) {
  EXPECT_EQ(job_lease_label("56", ""), "job 56");
  EXPECT_EQ(job_lease_label("56", "slice"), "job 56 slice");
  EXPECT_EQ(job_of_lease_label(job_lease_label("56", "slice")), "56");
  EXPECT_EQ(job_of_lease_label("job 56"), "56");
  for (const char* label :
       {"", "job", "job ", "job x", "job 56x", "jobs 56", " job 56", "job 12345678901234567890"})
    EXPECT_EQ(job_of_lease_label(label), "") << label;
}

}  // namespace
}  // namespace gpulock
