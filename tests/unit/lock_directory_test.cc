// The shared lock directory (src/local/lock_directory.h) and the OFD locks on its files
// (src/local/gpu_lock_file.h): explicit modes whatever the umask, refusal of planted symlinks,
// FIFOs and hard links, and the lock semantics gpulock's never-stale leases rest on.
#include "local/lock_directory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "backend/holder_record.h"
#include "gpulock/error.hpp"
#include "local/gpu_lock_file.h"
#include "scoped_umask.h"
#include "temp_dir.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;

const char* const kUuid = "GPU-5e1f0a7e-0000-4000-8000-000000000000";

using test_support::ScopedUmask;
using test_support::TempDir;

// Sets (or unsets) an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

mode_t ModeOf(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

mode_t ModeOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return 0;
  return st.st_mode & 07777;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Expects f to throw Error(kEnvironment) whose message contains `words`.
template <typename F>
void ExpectEnvironmentError(F&& f, const std::string& words) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << words << "'";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kEnvironment) << error.what();
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

class LockDirectoryTest : public ::testing::Test {
 protected:
  TempDir temp_;
  fs::path dir_path_ = temp_.path() / "locks";
};

// --- opening the directory ----------------------------------------------------------------

TEST_F(LockDirectoryTest, CreatesMissingDirectoryWithMode1777UnderUmask077) {
  ScopedUmask mask(077);
  const LockDirectory dir = LockDirectory::open(dir_path_);
  EXPECT_EQ(ModeOf(dir_path_), 01777u);
  EXPECT_EQ(dir.path(), dir_path_);
  EXPECT_GE(dir.fd(), 0);
  EXPECT_TRUE(dir.warnings().empty());
}

TEST_F(LockDirectoryTest, OpensAnExistingDirectoryAsItIs) {
  ASSERT_EQ(::mkdir(dir_path_.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir_path_.c_str(), 01777), 0);
  const LockDirectory dir = LockDirectory::open(dir_path_);
  EXPECT_TRUE(dir.warnings().empty());
  EXPECT_EQ(ModeOf(dir_path_), 01777u);
}

TEST_F(LockDirectoryTest, WarnsAboutAnExistingDirectoryOthersCannotUse) {
  ASSERT_EQ(::mkdir(dir_path_.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir_path_.c_str(), 0755), 0);
  const LockDirectory dir = LockDirectory::open(dir_path_);
  EXPECT_EQ(ModeOf(dir_path_), 0755u) << "an existing directory's mode must not be changed";
  ASSERT_EQ(dir.warnings().size(), 1u);
  EXPECT_NE(dir.warnings()[0].find("0755"), std::string::npos) << dir.warnings()[0];
  EXPECT_NE(dir.warnings()[0].find(dir_path_.string()), std::string::npos) << dir.warnings()[0];
}

TEST_F(LockDirectoryTest, RefusesASymlinkedDirectory) {
  const fs::path real = temp_.path() / "elsewhere";
  fs::create_directory(real);
  fs::create_directory_symlink(real, dir_path_);
  try {
    LockDirectory::open(dir_path_);
    ADD_FAILURE() << "followed a symlinked lock directory";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kEnvironment);
    EXPECT_NE(std::string(error.what()).find(dir_path_.string()), std::string::npos)
        << error.what();
  }
  EXPECT_TRUE(fs::is_empty(real));
}

// open(O_DIRECTORY | O_NOFOLLOW) fails with ENOTDIR, not ELOOP, on a symlink: the message must
// still say what it is.
TEST_F(LockDirectoryTest, SymlinkedDirectoryIsCalledASymlink) {
  const fs::path real = temp_.path() / "elsewhere";
  fs::create_directory(real);
  fs::create_directory_symlink(real, dir_path_);
  ExpectEnvironmentError([&] { LockDirectory::open(dir_path_); }, "symbolic link");
}

// Regression test for a fixed bug: LockDirectory::open (src/local/lock_directory.cc) follows a
// symlinked lock directory when the path ends in '/' (e.g. GPULOCK_DIR=/var/tmp/gpulock/): a
// trailing slash makes the kernel resolve the last component, so O_NOFOLLOW does not apply, and
// every lock then lives wherever the planted link points. Expected: refused like the same path
// without the slash.
TEST_F(LockDirectoryTest, RefusesASymlinkedDirectoryGivenWithATrailingSlash) {
  const fs::path real = temp_.path() / "elsewhere";
  fs::create_directory(real);
  fs::create_directory_symlink(real, dir_path_);
  try {
    LockDirectory::open(dir_path_.string() + "/");
    ADD_FAILURE() << "followed a symlinked lock directory given as " << dir_path_ << "/";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kEnvironment);
  }
}

TEST_F(LockDirectoryTest, RefusesAFileInPlaceOfTheDirectory) {
  std::ofstream(dir_path_) << "not a directory";
  ExpectEnvironmentError([&] { LockDirectory::open(dir_path_); }, "not a directory");
  EXPECT_EQ(ReadFile(dir_path_), "not a directory");
}

TEST_F(LockDirectoryTest, MissingParentIsAnEnvironmentError) {
  ExpectEnvironmentError([&] { LockDirectory::open(temp_.path() / "no" / "such" / "dir"); },
                         "parent directory does not exist");
}

TEST_F(LockDirectoryTest, EmptyPathIsAnEnvironmentError) {
  ExpectEnvironmentError([&] { LockDirectory::open(""); }, "empty");
}

// --- lock files ---------------------------------------------------------------------------

TEST_F(LockDirectoryTest, LockFileIsCreatedWithMode0666UnderUmask077) {
  ScopedUmask mask(077);
  const LockDirectory dir = LockDirectory::open(dir_path_);
  UniqueFd fd = dir.open_lock_file(kUuid);
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(ModeOf(fd.get()), 0666u);
  const fs::path file = dir_path_ / (std::string("gpu-") + kUuid + ".lock");
  EXPECT_EQ(dir.lock_file_path(kUuid), file);
  EXPECT_TRUE(fs::is_regular_file(file));
  EXPECT_EQ(ModeOf(file), 0666u);
  EXPECT_NE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, 0) << "lock fds must not leak into exec";
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDWR);
}

TEST_F(LockDirectoryTest, AcquireMutexIsCreatedWithMode0666) {
  ScopedUmask mask(077);
  const LockDirectory dir = LockDirectory::open(dir_path_);
  UniqueFd fd = dir.open_acquire_mutex();
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(ModeOf(dir_path_ / ".acquire.lock"), 0666u);
}

TEST_F(LockDirectoryTest, OwnLockFileWithATightModeIsRepaired) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  const fs::path file = dir.lock_file_path(kUuid);
  { UniqueFd created = dir.open_lock_file(kUuid); }
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  UniqueFd fd = dir.open_lock_file(kUuid);
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(ModeOf(file), 0666u);
}

TEST_F(LockDirectoryTest, ExistingLockFileIsReusedNotReplaced) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  UniqueFd first = dir.open_lock_file(kUuid);
  ASSERT_EQ(::pwrite(first.get(), "keep", 4, 0), 4);
  UniqueFd second = dir.open_lock_file(kUuid);
  struct stat a {
  }, b{};
  ASSERT_EQ(::fstat(first.get(), &a), 0);
  ASSERT_EQ(::fstat(second.get(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(ReadFile(dir.lock_file_path(kUuid)), "keep");
}

TEST_F(LockDirectoryTest, RefusesAPlantedSymlinkAndLeavesItsTargetAlone) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  const fs::path target = temp_.path() / "precious.txt";
  std::ofstream(target) << "precious";
  ASSERT_EQ(::chmod(target.c_str(), 0600), 0);
  fs::create_symlink(target, dir.lock_file_path(kUuid));

  ExpectEnvironmentError([&] { dir.open_lock_file(kUuid); }, "symbolic link");
  ExpectEnvironmentError([&] { dir.open_lock_file_for_reading(kUuid); }, "symbolic link");

  EXPECT_EQ(ReadFile(target), "precious");
  EXPECT_EQ(ModeOf(target), 0600u);
  UniqueFd target_fd(::open(target.c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(target_fd.valid());
  EXPECT_FALSE(is_locked_elsewhere(target_fd.get())) << "the target was locked through the link";
  EXPECT_TRUE(fs::is_symlink(dir.lock_file_path(kUuid))) << "the link must be left for root";
}

TEST_F(LockDirectoryTest, RefusesADanglingSymlinkWithoutCreatingItsTarget) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  const fs::path target = temp_.path() / "created-through-link";
  fs::create_symlink(target, dir.lock_file_path(kUuid));
  ExpectEnvironmentError([&] { dir.open_lock_file(kUuid); }, "symbolic link");
  EXPECT_FALSE(fs::exists(fs::symlink_status(target)));
}

TEST_F(LockDirectoryTest, RefusesAFifoWithoutHanging) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  ASSERT_EQ(::mkfifo(dir.lock_file_path(kUuid).c_str(), 0666), 0);
  ::alarm(30);  // a hang would otherwise stall the whole run: die loudly instead
  ExpectEnvironmentError([&] { dir.open_lock_file(kUuid); }, "not a regular file");
  ExpectEnvironmentError([&] { dir.open_lock_file_for_reading(kUuid); }, "not a regular file");
  ::alarm(0);
}

TEST_F(LockDirectoryTest, RefusesADirectoryInPlaceOfALockFile) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  fs::create_directory(dir.lock_file_path(kUuid));
  EXPECT_THROW(dir.open_lock_file(kUuid), Error);
  ExpectEnvironmentError([&] { dir.open_lock_file_for_reading(kUuid); }, "not a regular file");
}

TEST_F(LockDirectoryTest, RefusesAHardLinkedFile) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  const fs::path someones = temp_.path() / "someones-file";  // same file system
  std::ofstream(someones) << "data";
  ASSERT_EQ(::link(someones.c_str(), dir.lock_file_path(kUuid).c_str()), 0);
  ExpectEnvironmentError([&] { dir.open_lock_file(kUuid); }, "2 hard links");
  ExpectEnvironmentError([&] { dir.open_lock_file_for_reading(kUuid); }, "hard links");
  EXPECT_EQ(ReadFile(someones), "data");
}

TEST_F(LockDirectoryTest, LocksAWorldWritableFileWithAnotherHardLink) {
  // A 0666 lock file that someone hard-linked elsewhere still works as a lock (refusing it
  // would let anyone take a GPU away from everyone with one `ln`).
  const LockDirectory dir = LockDirectory::open(dir_path_);
  { UniqueFd created = dir.open_lock_file(kUuid); }
  const fs::path elsewhere = temp_.path() / "extra-link";
  ASSERT_EQ(::link(dir.lock_file_path(kUuid).c_str(), elsewhere.c_str()), 0);
  UniqueFd fd = dir.open_lock_file(kUuid);
  EXPECT_TRUE(try_lock_exclusive(fd.get()));
}

TEST_F(LockDirectoryTest, NoticesALockFileDeletedOrReplacedAfterItWasOpened) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  struct stat opened {};
  UniqueFd fd = dir.open_lock_file(kUuid, &opened);
  EXPECT_EQ(dir.links_if_current(opened, kUuid), std::optional<nlink_t>(1));
  ASSERT_EQ(::unlink(dir.lock_file_path(kUuid).c_str()), 0);
  EXPECT_EQ(dir.links_if_current(opened, kUuid), std::nullopt);  // deleted
  struct stat replaced {};
  UniqueFd replacement = dir.open_lock_file(kUuid, &replaced);
  EXPECT_EQ(dir.links_if_current(opened, kUuid), std::nullopt);  // replaced by a new file
  EXPECT_EQ(dir.links_if_current(replaced, kUuid), std::optional<nlink_t>(1));
}

TEST_F(LockDirectoryTest, CountsTheHardLinksOfTheCurrentLockFile) {
  // The first holder record is written only into a file with no other name (a file linked in
  // may be someone's): the count comes from the check made right after locking.
  const LockDirectory dir = LockDirectory::open(dir_path_);
  struct stat opened {};
  UniqueFd fd = dir.open_lock_file(kUuid, &opened);
  const fs::path elsewhere = temp_.path() / "extra-link";
  ASSERT_EQ(::link(dir.lock_file_path(kUuid).c_str(), elsewhere.c_str()), 0);
  EXPECT_EQ(dir.links_if_current(opened, kUuid), std::optional<nlink_t>(2));
}

TEST_F(LockDirectoryTest, PrepareCreatesEveryLockFile) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  const std::string other = "GPU-5e1f0a7e-0000-4000-8000-000000000001";
  dir.prepare({kUuid, other});
  for (const auto& uuid : {std::string(kUuid), other}) {
    struct stat st {};
    ASSERT_EQ(::lstat(dir.lock_file_path(uuid).c_str(), &st), 0) << uuid;
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0666u);
    if (::geteuid() == 0) {
      EXPECT_EQ(st.st_uid, 0u);
    }
  }
}

TEST_F(LockDirectoryTest, OpenForReadingMissingFileIsInvalidAndCreatesNothing) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  UniqueFd fd = dir.open_lock_file_for_reading(kUuid);
  EXPECT_FALSE(fd.valid());
  EXPECT_FALSE(fs::exists(dir.lock_file_path(kUuid)));
}

TEST_F(LockDirectoryTest, OpenForReadingIsReadOnly) {
  const LockDirectory dir = LockDirectory::open(dir_path_);
  { UniqueFd created = dir.open_lock_file(kUuid); }
  UniqueFd fd = dir.open_lock_file_for_reading(kUuid);
  ASSERT_TRUE(fd.valid());
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_ACCMODE, O_RDONLY);
}

TEST(LockFileNameTest, KeepsSafeCharacters) {
  EXPECT_EQ(LockDirectory::lock_file_name(kUuid), std::string("gpu-") + kUuid + ".lock");
  EXPECT_EQ(LockDirectory::lock_file_name("MIG-ab_12"), "gpu-MIG-ab_12.lock");
}

TEST(LockFileNameTest, SanitizesOddCharacters) {
  EXPECT_EQ(LockDirectory::lock_file_name("../../etc/passwd"), "gpu-______etc_passwd.lock");
  EXPECT_EQ(LockDirectory::lock_file_name("a b\n\x1b*"), "gpu-a_b___.lock");
  EXPECT_EQ(LockDirectory::lock_file_name("GPU-é"), "gpu-GPU-__.lock");  // two UTF-8 bytes
  EXPECT_EQ(LockDirectory::lock_file_name(std::string("x\0y", 3)), "gpu-x_y.lock");
  for (const char* odd : {"/", "..", "a/b", "\\", "x.lock"}) {
    const std::string name = LockDirectory::lock_file_name(odd);
    EXPECT_EQ(name.find('/'), std::string::npos) << name;
    EXPECT_TRUE(LockDirectory::is_lock_file_name(name)) << name;
  }
}

TEST(LockFileNameTest, RecognisesLockFileNames) {
  EXPECT_TRUE(LockDirectory::is_lock_file_name(LockDirectory::lock_file_name(kUuid)));
  EXPECT_FALSE(LockDirectory::is_lock_file_name(".acquire.lock"));
  EXPECT_FALSE(LockDirectory::is_lock_file_name("gpu-.lock"));
  EXPECT_FALSE(LockDirectory::is_lock_file_name("gpu-x.lock.tmp"));
  EXPECT_FALSE(LockDirectory::is_lock_file_name("cpu-x.lock"));
}

TEST(DefaultLockDirectoryTest, HonoursGpulockDir) {
  ScopedEnv env("GPULOCK_DIR", "/some/where/locks");
  EXPECT_EQ(default_lock_directory(), fs::path("/some/where/locks"));
}

TEST(DefaultLockDirectoryTest, FallsBackWhenUnsetOrEmpty) {
  for (const char* value : {static_cast<const char*>(nullptr), ""}) {
    ScopedEnv env("GPULOCK_DIR", value);
    const fs::path dir = default_lock_directory();
    EXPECT_TRUE(dir == "/run/lock/gpulock" || dir == "/var/tmp/gpulock") << dir;
  }
}

// --- OFD lock semantics -------------------------------------------------------------------

class GpuLockFileTest : public LockDirectoryTest {
 protected:
  LockDirectory dir_ = LockDirectory::open(dir_path_);
};

TEST_F(GpuLockFileTest, TwoOpensInOneProcessConflict) {
  UniqueFd a = dir_.open_lock_file(kUuid);
  UniqueFd b = dir_.open_lock_file(kUuid);
  EXPECT_FALSE(is_locked_elsewhere(a.get()));
  ASSERT_TRUE(try_lock_exclusive(a.get()));
  EXPECT_FALSE(try_lock_exclusive(b.get())) << "OFD locks must conflict within one process";
  EXPECT_TRUE(is_locked_elsewhere(b.get()));
  EXPECT_FALSE(is_locked_elsewhere(a.get())) << "our own lock is not held elsewhere";
  EXPECT_TRUE(try_lock_exclusive(a.get())) << "re-locking through the holder succeeds";
  unlock(a.get());
  EXPECT_TRUE(try_lock_exclusive(b.get()));
  EXPECT_FALSE(try_lock_exclusive(a.get()));
}

TEST_F(GpuLockFileTest, ClosingTheHoldingDescriptorReleases) {
  UniqueFd a = dir_.open_lock_file(kUuid);
  UniqueFd b = dir_.open_lock_file(kUuid);
  ASSERT_TRUE(try_lock_exclusive(a.get()));
  a.reset();
  EXPECT_FALSE(is_locked_elsewhere(b.get()));
  EXPECT_TRUE(try_lock_exclusive(b.get()));
}

TEST_F(GpuLockFileTest, LockSurvivesClosingAnotherDescriptorOfTheFile) {
  UniqueFd holder = dir_.open_lock_file(kUuid);
  ASSERT_TRUE(try_lock_exclusive(holder.get()));
  {
    UniqueFd other = dir_.open_lock_file(kUuid);  // a classic POSIX lock would die with this
    UniqueFd reader = dir_.open_lock_file_for_reading(kUuid);
  }
  {
    UniqueFd duplicate(::dup(holder.get()));  // the same open file description
    ASSERT_TRUE(duplicate.valid());
  }
  UniqueFd probe = dir_.open_lock_file(kUuid);
  EXPECT_TRUE(is_locked_elsewhere(probe.get()));
  EXPECT_FALSE(try_lock_exclusive(probe.get()));
}

TEST_F(GpuLockFileTest, IsLockedElsewhereTakesNothing) {
  UniqueFd reader = dir_.open_lock_file_for_reading(kUuid);
  EXPECT_FALSE(reader.valid()) << "no file yet";
  UniqueFd holder = dir_.open_lock_file(kUuid);
  reader = dir_.open_lock_file_for_reading(kUuid);
  ASSERT_TRUE(reader.valid());

  EXPECT_FALSE(is_locked_elsewhere(reader.get()));
  EXPECT_FALSE(is_locked_elsewhere(reader.get()));
  ASSERT_TRUE(try_lock_exclusive(holder.get())) << "the query took the lock";

  EXPECT_TRUE(is_locked_elsewhere(reader.get()));
  unlock(holder.get());
  EXPECT_FALSE(is_locked_elsewhere(reader.get()));
  UniqueFd other = dir_.open_lock_file(kUuid);
  EXPECT_TRUE(try_lock_exclusive(other.get())) << "the query left something behind";
}

TEST_F(GpuLockFileTest, BlockingLockWaitsForRelease) {
  UniqueFd holder = dir_.open_lock_file(kUuid);
  ASSERT_TRUE(try_lock_exclusive(holder.get()));
  UniqueFd waiter_fd = dir_.open_lock_file(kUuid);
  std::thread waiter([&] { lock_exclusive(waiter_fd.get()); });
  holder.reset();
  waiter.join();  // returns only once the lock is ours
  UniqueFd probe = dir_.open_lock_file(kUuid);
  EXPECT_TRUE(is_locked_elsewhere(probe.get()));
}

TEST_F(GpuLockFileTest, ForkedChildKeepsTheLockAfterTheParentCloses) {
  UniqueFd held = dir_.open_lock_file(kUuid);
  ASSERT_TRUE(try_lock_exclusive(held.get()));
  int to_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child inherits `held` and keeps it until the parent closes the pipe.
    ::close(to_child[1]);
    char c;
    while (::read(to_child[0], &c, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  ::close(to_child[0]);
  held.reset();  // the parent's copy

  UniqueFd probe = dir_.open_lock_file(kUuid);
  EXPECT_TRUE(is_locked_elsewhere(probe.get())) << "the lock died with the parent's descriptor";
  EXPECT_FALSE(try_lock_exclusive(probe.get()));

  ::close(to_child[1]);  // the child exits
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_FALSE(is_locked_elsewhere(probe.get())) << "the kernel did not release the lock";
  EXPECT_TRUE(try_lock_exclusive(probe.get()));
}

TEST_F(GpuLockFileTest, ForkedChildKilledBySigkillReleases) {
  UniqueFd held = dir_.open_lock_file(kUuid);
  ASSERT_TRUE(try_lock_exclusive(held.get()));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    while (true) ::pause();
  }
  held.reset();
  UniqueFd probe = dir_.open_lock_file(kUuid);
  EXPECT_TRUE(is_locked_elsewhere(probe.get()));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(try_lock_exclusive(probe.get()));
}

TEST_F(GpuLockFileTest, RecordBytesRoundTrip) {
  UniqueFd fd = dir_.open_lock_file(kUuid);
  EXPECT_EQ(read_record_bytes(fd.get()), "") << "a new lock file is empty";
  HolderRecord record;
  record.lease_id = "0123456789abcdef";
  record.user = "alice";
  record.holder = ProcessId{4711, 1};
  record.gpus = {kUuid};
  const std::string bytes = serialize_holder_record(record);
  EXPECT_EQ(write_record_bytes(fd.get(), bytes), std::nullopt);
  EXPECT_EQ(read_record_bytes(fd.get()), bytes);
  // A later record replaces the earlier one in place.
  record.user = "bob";
  ASSERT_EQ(write_record_bytes(fd.get(), serialize_holder_record(record)), std::nullopt);
  const auto back = parse_holder_record(read_record_bytes(fd.get()));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->user, "bob");
  EXPECT_EQ(fs::file_size(dir_.lock_file_path(kUuid)), kHolderRecordSize);
}

TEST_F(GpuLockFileTest, ReadRecordBytesReadsAtMostOneRecord) {
  UniqueFd fd = dir_.open_lock_file(kUuid);
  const std::string big(3 * kHolderRecordSize, 'x');
  ASSERT_EQ(write_record_bytes(fd.get(), big), std::nullopt);
  EXPECT_EQ(read_record_bytes(fd.get()).size(), kHolderRecordSize);
}

}  // namespace
}  // namespace gpulock
