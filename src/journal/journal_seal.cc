// Sealing, rotating and checking the append-only flag of the local usage journal's files.
#include "journal/journal_seal.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <vector>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "journal/file_journal.h"
#include "journal/journal_rewriters.h"
#include "util/fd.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

constexpr mode_t kJournalFileMode = 0644;

// Errors by which a file system says it has no inode flags, or not this one.
bool means_unsupported(int error) {
  return error == ENOTTY || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL;
}

// The uid a journal file's name gives, and whether it is the current file ("usage-<uid>.log")
// rather than a rotated one; nullopt for a name of neither form.
std::optional<uid_t> uid_of_name(std::string_view name, bool& current) {
  if (!is_journal_file_name(name)) return std::nullopt;
  const std::string_view rest = name.substr(6);  // after "usage-"
  uid_t uid = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), uid);
  if (error != std::errc() || end == rest.data()) return std::nullopt;
  const std::string_view tail(end, rest.data() + rest.size() - end);
  current = tail == ".log";
  if (!current && !tail.starts_with('-')) return std::nullopt;
  return uid;
}

UniqueFd open_for_flags(int dir_fd, const std::string& name) {
  return UniqueFd(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
}

class DirectorySealer {
 public:
  DirectorySealer(int dir_fd, std::uint64_t max_file_bytes, JournalSealReport& report)
      : dir_fd_(dir_fd), max_file_bytes_(max_file_bytes), report_(report) {}

  // Seals (and rotates, where full) one file. False once the file system proved unable to.
  bool seal(const std::string& name) {
    bool current = false;
    const auto uid = uid_of_name(name, current);
    if (!uid) return problem(name, "not a journal file name: left alone");
    const UniqueFd fd = open_for_flags(dir_fd_, name);
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0)
      return problem(name, std::string("cannot open: ") + std::strerror(errno));
    // Never seal what a user planted under a name not theirs, or a link to another file: the
    // seal would make it permanent.
    if (!S_ISREG(st.st_mode)) return problem(name, "not a regular file: left alone");
    if (st.st_nlink != 1) return problem(name, "has other hard links: left alone");
    if (st.st_uid != *uid)
      return problem(name, fmt::format("owned by uid {}, not {}: left alone", st.st_uid, *uid));
    int error = 0;
    SealState state = seal_state(fd.get(), &error);
    if (state == SealState::kUnsupported) return unsupported(error);
    if ((st.st_mode & 07777) != kJournalFileMode) {  // readable by everyone's `gpulock usage`
      if (state == SealState::kSealed && (error = set_sealed(fd.get(), false)) != 0)
        return failed(name, "cannot unseal it to fix its mode", error);
      state = SealState::kUnsealed;
      if (::fchmod(fd.get(), kJournalFileMode) != 0)
        problem(name, errno_message("cannot set its mode to 0644", errno));
    }
    if (current && static_cast<std::uint64_t>(st.st_size) >= max_file_bytes_)
      return rotate(name, *uid, fd.get(), st, state);
    if (state == SealState::kSealed) {
      ++report_.already_sealed;
      return true;
    }
    if ((error = set_sealed(fd.get(), true)) != 0) return failed(name, "cannot seal", error);
    report_.sealed.push_back(name);
    return true;
  }

 private:
  // Renames the full current file away, sealed, and puts a new sealed one of the user's in its
  // place. The file's flock() keeps the user's own rotating gpulock (of a file not yet sealed)
  // out meanwhile.
  bool rotate(const std::string& name, uid_t uid, int fd, const struct stat& st, SealState state) {
    while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    struct stat now {};
    const bool still_there = ::fstatat(dir_fd_, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 &&
                             now.st_ino == st.st_ino && now.st_dev == st.st_dev;
    int error = 0;
    if (still_there && state == SealState::kSealed && (error = set_sealed(fd, false)) != 0) {
      ::flock(fd, LOCK_UN);
      return failed(name, "cannot unseal it to rotate it", error);
    }
    std::string rotated;
    if (still_there) {
      rotated = fmt::format("usage-{}-{}-{}.log", uid, static_cast<long long>(std::time(nullptr)),
                            make_lease_id());
      if (::renameat(dir_fd_, name.c_str(), dir_fd_, rotated.c_str()) != 0) {
        problem(name, errno_message("cannot rotate", errno));
        rotated.clear();
      }
    }
    // Sealed again whatever happened: renamed by us, by its user meanwhile, or not at all.
    error = set_sealed(fd, true);
    ::flock(fd, LOCK_UN);
    if (error != 0) return failed(rotated.empty() ? name : rotated, "cannot seal", error);
    if (!rotated.empty())
      report_.rotated.push_back(name + " -> " + rotated);
    else if (state == SealState::kUnsealed)
      report_.sealed.push_back(name);
    return make_current(name, uid, st.st_gid);
  }

  // The user's new current file, sealed before anything is written to it; one the user's
  // gpulock made meanwhile is sealed as any other.
  bool make_current(const std::string& name, uid_t uid, gid_t gid) {
    UniqueFd fd(::openat(dir_fd_, name.c_str(),
                         O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kJournalFileMode));
    if (!fd) {
      if (errno == EEXIST) return seal(name);
      return problem(name, errno_message("cannot make the new file", errno));
    }
    if (::fchown(fd.get(), uid, gid) != 0 || ::fchmod(fd.get(), kJournalFileMode) != 0) {
      const int error = errno;
      ::unlinkat(dir_fd_, name.c_str(), 0);  // root's own file would shut the user out
      return problem(name, errno_message("cannot give the new file to its user", error));
    }
    if (const int error = set_sealed(fd.get(), true); error != 0)
      return failed(name, "cannot seal the new file", error);
    return true;
  }

  bool problem(const std::string& name, const std::string& what) {
    report_.problems.push_back(fmt::format("{}: {}", name, what));
    return true;
  }
  bool failed(const std::string& name, const std::string& what, int error) {
    if (means_unsupported(error)) return unsupported(error);
    return problem(name, errno_message(what, error));
  }
  bool unsupported(int error) {
    report_.supported = false;
    report_.unsupported_reason = std::strerror(error);
    return false;
  }

  const int dir_fd_;
  const std::uint64_t max_file_bytes_;
  JournalSealReport& report_;
};

}  // namespace

SealState seal_state(int fd, int* error) noexcept {
  int flags = 0;  // an int, whatever linux/fs.h's _IOR says (ioctl_iflags(2))
  if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) {
    if (error) *error = errno;
    return SealState::kUnsupported;
  }
  return (flags & FS_APPEND_FL) ? SealState::kSealed : SealState::kUnsealed;
}

int set_sealed(int fd, bool sealed) noexcept {
  int flags = 0;
  if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) return errno;
  const int wanted = sealed ? (flags | FS_APPEND_FL) : (flags & ~FS_APPEND_FL);
  if (wanted == flags) return 0;
  if (::ioctl(fd, FS_IOC_SETFLAGS, &wanted) != 0) return errno;
  return 0;
}

JournalSealReport seal_journal_directory(const std::filesystem::path& directory,
                                         std::uint64_t max_file_bytes) {
  JournalSealReport report;
  report.location = directory.string();
  if (::geteuid() != 0)
    throw Error(ErrorCode::kPermissionDenied,
                "only root can seal the usage journal (CAP_LINUX_IMMUTABLE): run `sudo gpulock "
                "journal seal`");
  const UniqueFd dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir)
    throw Error(ErrorCode::kEnvironment,
                errno_message(fmt::format("cannot open the usage journal {} (`gpulock init` "
                                          "makes it)",
                                          report.location),
                              errno));
  DirectorySealer sealer(dir.get(), max_file_bytes, report);
  for (const auto& name : journal_file_names(dir.get()))
    if (!sealer.seal(name)) break;
  if (report.supported) {  // an empty journal says nothing about its file system: ask it
    int error = 0;
    if (seal_state(dir.get(), &error) == SealState::kUnsupported && means_unsupported(error)) {
      report.supported = false;
      report.unsupported_reason = std::strerror(error);
    }
  }
  // The seal does not bind a descriptor opened for writing before it: name those who hold one.
  if (report.supported)
    for (auto& line : find_journal_rewriters(dir.get())) report.problems.push_back(std::move(line));
  return report;
}

std::optional<DoctorCheck> journal_seal_check(const std::filesystem::path& directory) {
  using Level = DoctorCheck::Level;
  const UniqueFd dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!dir || ::fstat(dir.get(), &st) != 0 || st.st_uid != 0) return std::nullopt;
  int error = 0;
  if (seal_state(dir.get(), &error) == SealState::kUnsupported)
    return DoctorCheck{Level::kWarning, "journal seal",
                       fmt::format("the file system of {} cannot seal files append-only ({}): "
                                   "each user can rewrite their own records (docs/operations.md)",
                                   directory.string(), std::strerror(error))};
  std::vector<std::string> unsealed;
  const auto names = journal_file_names(dir.get());
  for (const auto& name : names) {
    const UniqueFd fd = open_for_flags(dir.get(), name);
    if (fd && seal_state(fd.get()) == SealState::kUnsealed) unsealed.push_back(name);
  }
  if (unsealed.empty())
    return DoctorCheck{Level::kOk, "journal seal",
                       names.empty() ? std::string("no journal files yet")
                                     : fmt::format("{} file{} sealed append-only", names.size(),
                                                   names.size() == 1 ? "" : "s")};
  std::string listed;
  for (std::size_t i = 0; i < unsealed.size() && i < 3; ++i)
    listed += (i ? ", " : "") + unsealed[i];
  if (unsealed.size() > 3) listed += ", ...";
  return DoctorCheck{Level::kWarning, "journal seal",
                     fmt::format("{} of {} journal files not sealed append-only ({}): their "
                                 "owners can rewrite them; run `gpulock journal seal` as root "
                                 "(contrib/systemd/gpulock-journal.timer)",
                                 unsealed.size(), names.size(), listed)};
}

// Each journal's `gpulock journal seal`: only files can be sealed.
JournalSealReport UsageJournal::seal() {
  throw Error(ErrorCode::kEnvironment,
              fmt::format("the usage journal is kept in the pool ({}): there are no files to seal",
                          location()));
}
JournalSealReport DisabledJournal::seal() {
  throw Error(ErrorCode::kEnvironment,
              "the usage journal is off (journal_dir or GPULOCK_JOURNAL_DIR): nothing to seal");
}
JournalSealReport FileJournal::seal() {
  return seal_journal_directory(directory_, max_file_bytes_);
}

}  // namespace gpulock
