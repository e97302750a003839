// run_command() (include/gpulock/run.hpp) under a lease whose keeper a test controls
// (fake_lease_keeper.h): the lease environment, the holder record, and --on-lease-loss, with a
// real child process. The loss is declared once the command shows it runs (it writes a file),
// so nothing here depends on how fast anything happens.
#include "gpulock/run.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "fake_lease_keeper.h"
#include "temp_dir.h"

namespace gpulock {
namespace {

using test_support::FakeLease;
using test_support::FakeLeaseKeeper;
using test_support::TempDir;
using namespace std::chrono_literals;

// Long enough never to be reached by a test that works; only a guard against hanging forever.
constexpr auto kHangGuard = std::chrono::minutes(2);

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Declares the lease lost from a thread of its own (as a keeper's renewal thread does) once
// `marker` exists, then creates `declared` (when given). The thread takes no signals:
// run_command() reads them from a signalfd, which only works while every thread blocks them.
class LossWhenMarked {
 public:
  LossWhenMarked(FakeLeaseKeeper& keeper, std::filesystem::path marker,
                 std::filesystem::path declared = {}) {
    sigset_t all, previous;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &previous);
    thread_ = std::thread([&keeper, marker = std::move(marker), declared = std::move(declared)] {
      const auto give_up = std::chrono::steady_clock::now() + kHangGuard;
      while (!std::filesystem::exists(marker) && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(5ms);
      keeper.declare_lost("test: renewal failed for a whole TTL");
      if (!declared.empty()) std::ofstream(declared).put('\n');
    });
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  }
  ~LossWhenMarked() { thread_.join(); }

 private:
  std::thread thread_;
};

class RunCommandTest : public ::testing::Test {
 protected:
  std::shared_ptr<FakeLeaseKeeper::Log> log_ = std::make_shared<FakeLeaseKeeper::Log>();
  TempDir temp_{"run-command"};
};

TEST_F(RunCommandTest, TheCommandGetsTheLeaseEnvironmentAndTheRecordNamesIt) {
  Lease lease = FakeLease(std::make_unique<FakeLeaseKeeper>(log_, 42, "hostA"), 2);
  const auto out = temp_.path() / "env";
  const auto published = temp_.path() / "published";
  // The command lives until its record is published, so that the record can name it.
  log_->after_publish = [published] { std::ofstream(published).put('\n'); };
  const int status = run_command(
      lease,
      {"sh", "-c",
       "printf '%s|%s|%s|%s\\n' \"$CUDA_VISIBLE_DEVICES\" \"$GPULOCK_LEASE_ID\" "
       "\"$GPULOCK_FENCING_TOKEN\" \"$GPULOCK_LEASE_HOST\" > \"$0\"; i=0; "
       "while [ ! -e \"$1\" ] && [ $i -lt 24000 ]; do sleep 0.005; i=$((i+1)); done; exit 7",
       out.string(), published.string()},
      VisibleFormat::kIndex);
  EXPECT_EQ(status, 7);
  EXPECT_EQ(ReadFile(out), "0,1|0123456789abcdef|42|hostA\n");
  std::lock_guard<std::mutex> lock(log_->mutex);
  ASSERT_FALSE(log_->published.empty());
  const HolderRecord& record = log_->published.back();
  EXPECT_EQ(record.kind, HolderKind::kRun);
  EXPECT_EQ(record.holder.pid, ::getpid());
  EXPECT_EQ(record.members.size(), 1u);  // the command
}

TEST_F(RunCommandTest, OnLeaseLossKillStopsTheCommandWithSigterm) {
  auto keeper = std::make_unique<FakeLeaseKeeper>(log_, 7, "hostA");
  FakeLeaseKeeper& control = *keeper;
  Lease lease = FakeLease(std::move(keeper));
  const auto marker = temp_.path() / "running";
  int status = 0;
  {
    LossWhenMarked loss(control, marker);
    // Runs until stopped; the hang guard ends it (with another status) if the kill never comes.
    status = run_command(lease, {"sh", "-c", ": > \"$0\"; exec sleep 120", marker.string()},
                         VisibleFormat::kIndex, LeaseLossAction::kKill);
  }
  EXPECT_EQ(status, 128 + SIGTERM);
  EXPECT_TRUE(lease.lost());
}

TEST_F(RunCommandTest, OnLeaseLossWarnLetsTheCommandFinish) {
  auto keeper = std::make_unique<FakeLeaseKeeper>(log_, 7, "hostA");
  FakeLeaseKeeper& control = *keeper;
  Lease lease = FakeLease(std::move(keeper));
  const auto marker = temp_.path() / "running";
  const auto declared = temp_.path() / "declared";
  int status = 0;
  testing::internal::CaptureStderr();
  {
    LossWhenMarked loss(control, marker, declared);
    // The command ends by itself only once the loss has been declared (or at the hang guard).
    status = run_command(lease,
                         {"sh", "-c",
                          ": > \"$0\"; i=0; while [ ! -e \"$1\" ] && [ $i -lt 24000 ]; do "
                          "sleep 0.005; i=$((i+1)); done; exit 3",
                          marker.string(), declared.string()},
                         VisibleFormat::kIndex, LeaseLossAction::kWarn);
  }
  const std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(status, 3);
  EXPECT_TRUE(lease.lost());
  EXPECT_NE(warnings.find("lease 0123456789abcdef lost: test: renewal failed for a whole TTL"),
            std::string::npos)
      << warnings;
  EXPECT_NE(warnings.find("The command keeps running"), std::string::npos) << warnings;
}

TEST_F(RunCommandTest, ALeaseLostBeforeTheCommandStartsStopsItUnderKill) {
  auto keeper = std::make_unique<FakeLeaseKeeper>(log_, 7, "hostA");
  keeper->declare_lost("lost already");  // before run_command() asks to be told
  Lease lease = FakeLease(std::move(keeper));
  // Without the kill it would run until the hang guard.
  const int status = run_command(lease, {"sh", "-c", "exec sleep 120"}, VisibleFormat::kIndex,
                                 LeaseLossAction::kKill);
  EXPECT_EQ(status, 128 + SIGTERM);
}

TEST_F(RunCommandTest, ReleasingTheLeaseDestroysItsKeeper) {
  Lease lease = FakeLease(std::make_unique<FakeLeaseKeeper>(log_, 1, "h"));
  EXPECT_FALSE(log_->destroyed);
  lease.release();
  EXPECT_TRUE(log_->destroyed);
  EXPECT_FALSE(lease.active());
  EXPECT_EQ(lease.fencing_token(), 0u);
}

}  // namespace
}  // namespace gpulock
