// Sealing the local journal append-only (journal/journal_seal.h), in a temporary directory, as
// root: a sealed file refuses rewrites and renames while FileJournal goes on appending (its own
// rotation left to root, without a warning); root's pass seals, rotates a full file into a
// sealed one plus a new sealed file of its user, and leaves a planted file alone. Skipped when
// not root or where the temporary directory's file system has no append-only flag.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gpulock/error.hpp"
#include "journal/file_journal.h"
#include "journal/journal_seal.h"
#include "temp_dir.h"
#include "util/fd.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

// An independent look at the flag: lsattr's ioctl on a fresh descriptor.
bool sealed(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  return fd && seal_state(fd.get()) == SealState::kSealed;
}

// Root, on a file system that can seal: a probe file sealed and unsealed.
bool can_seal_in(const fs::path& dir) {
  if (::geteuid() != 0) return false;
  const fs::path probe = dir / "probe";
  UniqueFd fd(::open(probe.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) return false;
  const bool ok = set_sealed(fd.get(), true) == 0 && set_sealed(fd.get(), false) == 0;
  ::unlink(probe.c_str());
  return ok;
}

// Unseals everything under the directory, so that TempDir can remove it.
class UnsealOnExit {
 public:
  explicit UnsealOnExit(fs::path dir) : dir_(std::move(dir)) {}
  ~UnsealOnExit() {
    std::error_code ignored;
    for (const auto& entry : fs::directory_iterator(dir_, ignored)) {
      UniqueFd fd(::open(entry.path().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      if (fd) set_sealed(fd.get(), false);
    }
  }

 private:
  fs::path dir_;
};

JournalRecord record(int n) {
  JournalRecord r;
  r.kind = JournalRecord::Kind::kStart;
  r.lease_id = "lease" + std::to_string(n);
  r.time = 1000 + n;
  r.user = "root";
  r.host = "node";
  r.gpus.push_back(JournalGpu{"GPU-1", 0});
  r.label = std::string(100, 'x');
  return r;
}

#define SKIP_UNLESS_SEALABLE(dir) \
  if (!can_seal_in(dir))          \
  GTEST_SKIP() << "needs root and a file system with the append-only flag (" << (dir) << ")"

TEST(JournalSeal, SealedFileTakesAppendsOnlyAndItsWriterLeavesRotationToRoot) {
  TempDir tmp("seal");
  SKIP_UNLESS_SEALABLE(tmp.path());
  UnsealOnExit unseal(tmp.path());
  const fs::path own = tmp.path() / ("usage-" + std::to_string(::geteuid()) + ".log");
  FileJournal journal(tmp.path(), 1024);
  journal.append(record(0));
  ASSERT_TRUE(fs::exists(own));

  const JournalSealReport first = seal_journal_directory(tmp.path(), 1024);
  EXPECT_TRUE(first.supported);
  EXPECT_EQ(first.sealed, std::vector<std::string>{own.filename().string()});
  EXPECT_TRUE(first.problems.empty());
  ASSERT_TRUE(sealed(own));

  // Not even root rewrites it now.
  EXPECT_LT(::open(own.c_str(), O_WRONLY | O_CLOEXEC), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::truncate(own.c_str(), 0), 0);
  EXPECT_NE(::rename(own.c_str(), (tmp.path() / "elsewhere").c_str()), 0);
  EXPECT_NE(::unlink(own.c_str()), 0);

  // Past the size limit the writer cannot rename it: it keeps appending, and says nothing.
  testing::internal::CaptureStderr();
  for (int n = 1; n <= 40; ++n) journal.append(record(n));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_GT(fs::file_size(own), 1024u);
  EXPECT_EQ(journal_file_names(UniqueFd(::open(tmp.path().c_str(), O_RDONLY)).get()).size(), 1u);

  // Root's pass rotates it: the full file renamed and still sealed, a new sealed one in place.
  const JournalSealReport second = seal_journal_directory(tmp.path(), 1024);
  ASSERT_EQ(second.rotated.size(), 1u);
  EXPECT_TRUE(second.problems.empty());
  ASSERT_TRUE(fs::exists(own));
  EXPECT_EQ(fs::file_size(own), 0u);
  EXPECT_TRUE(sealed(own));
  struct stat st {};
  ASSERT_EQ(::stat(own.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  const std::string rotated = second.rotated[0].substr(second.rotated[0].find(" -> ") + 4);
  EXPECT_TRUE(sealed(tmp.path() / rotated));

  // The writer finds the new file at a later size check; every record stays readable.
  for (int n = 41; n <= 140; ++n) journal.append(record(n));
  EXPECT_GT(fs::file_size(own), 0u);
  const JournalContents contents = journal.read();
  EXPECT_TRUE(contents.warnings.empty()) << contents.warnings.front();
  EXPECT_EQ(contents.records.size(), 141u);
}

TEST(JournalSeal, PlantedAndStrangeFilesAreLeftAloneAndReported) {
  TempDir tmp("seal");
  SKIP_UNLESS_SEALABLE(tmp.path());
  UnsealOnExit unseal(tmp.path());
  // A file under uid 4242's name owned by someone else, and a hard link to another file.
  const fs::path planted = tmp.path() / "usage-4242.log";
  UniqueFd(::open(planted.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_EQ(::chown(planted.c_str(), 4343, 4343), 0);
  const fs::path target = tmp.path() / "other";
  UniqueFd(::open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  const fs::path linked = tmp.path() / ("usage-" + std::to_string(::geteuid()) + "-x.log");
  ASSERT_EQ(::link(target.c_str(), linked.c_str()), 0);
  const fs::path odd = tmp.path() / "usage-notanumber.log";
  UniqueFd(::open(odd.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));

  const JournalSealReport report = seal_journal_directory(tmp.path(), 1 << 20);
  EXPECT_TRUE(report.sealed.empty());
  ASSERT_EQ(report.problems.size(), 3u);
  EXPECT_FALSE(sealed(planted));
  EXPECT_FALSE(sealed(target));
  EXPECT_FALSE(sealed(odd));
}

TEST(JournalSeal, OnlyRootSeals) {
  if (::geteuid() == 0) GTEST_SKIP() << "checks a user's refusal";
  TempDir tmp("seal");
  EXPECT_THROW(seal_journal_directory(tmp.path(), 1024), Error);
}

}  // namespace
}  // namespace gpulock
