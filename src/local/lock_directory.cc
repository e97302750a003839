// The shared lock directory: creation with explicit modes, safe opens, file-system checks.
#include "local/lock_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "process/process_identity.h"

namespace gpulock {
namespace {

constexpr mode_t kSharedDirMode = 01777;
constexpr mode_t kLockFileMode = 0666;

// Magic numbers of network file systems, where flock/OFD locks are emulated or unreliable.
constexpr long kNfsMagic = 0x6969;
constexpr long kSmbMagic = 0x517B;
constexpr long kCifsMagic = static_cast<long>(0xFF534D42);
constexpr long kSmb2Magic = static_cast<long>(0xFE534D42);

[[noreturn]] void environment_error(const std::string& message) {
  throw Error(ErrorCode::kEnvironment, message);
}

std::string mode_text(mode_t mode) {
  return fmt::format("{:04o}", mode & 07777);
}

void check_file_system(int dir_fd, const std::filesystem::path& path) {
  struct statfs fs {};
  if (::fstatfs(dir_fd, &fs) != 0) return;
  const long type = static_cast<long>(fs.f_type);
  const char* name = type == kNfsMagic                                                 ? "NFS"
                     : (type == kSmbMagic || type == kCifsMagic || type == kSmb2Magic) ? "SMB/CIFS"
                                                                                       : nullptr;
  if (name != nullptr) {
    environment_error(fmt::format(
        "lock directory {} is on {}, where file locks are emulated and unreliable; set "
        "GPULOCK_DIR to a local path such as /run/lock/gpulock (for several hosts, use the Redis "
        "backend)",
        path.string(), name));
  }
}

}  // namespace

std::filesystem::path default_lock_directory() {
  if (const char* dir = std::getenv("GPULOCK_DIR"); dir != nullptr && *dir != '\0') return dir;
  struct stat st {};
  if (::lstat("/run/lock/gpulock", &st) == 0) return "/run/lock/gpulock";
  if (::stat("/run/lock", &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 01777) == 01777)
    return "/run/lock/gpulock";
  return "/var/tmp/gpulock";
}

LockDirectory LockDirectory::open(const std::filesystem::path& path) {
  if (path.empty()) environment_error("lock directory path is empty (GPULOCK_DIR)");
  // A trailing slash would make the kernel follow a symlink in the last component despite
  // O_NOFOLLOW, so it goes.
  std::string p = path.string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  bool created = false;
  if (::mkdir(p.c_str(), 0700) == 0) {
    created = true;
  } else if (errno != EEXIST) {
    const int e = errno;
    environment_error(fmt::format(
        "cannot create lock directory {}: {}{}", p, std::strerror(e),
        e == ENOENT ? " (its parent directory does not exist)"
                    : "; set GPULOCK_DIR to a directory you can write, e.g. /var/tmp/gpulock"));
  }
  UniqueFd fd(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  // Another user's process may have created it a moment ago, still with mode 0700.
  for (int attempt = 0; !fd && errno == EACCES && !created && attempt < 50; ++attempt) {
    ::usleep(1000);
    fd.reset(::open(p.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  }
  if (!fd) {
    int e = errno;
    struct stat link {};
    if (e == ENOTDIR && ::lstat(p.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) e = ELOOP;
    if (e == ELOOP || e == ENOTDIR) {
      environment_error(fmt::format(
          "lock directory {} is {}: refusing to use it (a planted symlink could redirect every "
          "lock); remove it, or set GPULOCK_DIR to the real directory",
          p, e == ELOOP ? "a symbolic link" : "not a directory"));
    }
    environment_error(fmt::format("cannot open lock directory {}: {}", p, std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    environment_error(errno_message("cannot stat lock directory " + p, errno));
  if (!created && st.st_uid == ::geteuid() && (st.st_mode & 07777) == 0700) {
    // Mode 0700 and ours, not made by this call: most likely another process of this user
    // created it a moment ago and is about to set mode 1777. Give it that moment before
    // warning about the mode (several first uses at once would otherwise warn falsely).
    for (int attempt = 0; attempt < 50 && (st.st_mode & 07777) == 0700; ++attempt) {
      ::usleep(1000);
      if (::fstat(fd.get(), &st) != 0)
        environment_error(errno_message("cannot stat lock directory " + p, errno));
    }
  }
  if (created && st.st_uid == ::geteuid()) {
    // Explicit mode, never the umask: every user must be able to create lock files here, and
    // the sticky bit stops them from deleting or renaming each other's.
    if (::fchmod(fd.get(), kSharedDirMode) != 0)
      environment_error(errno_message("cannot set mode 1777 on lock directory " + p, errno));
    st.st_mode = (st.st_mode & ~07777) | kSharedDirMode;
  }
  check_file_system(fd.get(), path);

  LockDirectory dir(path, std::move(fd));
  if (st.st_uid != 0) {
    // In a sticky directory its owner may delete anyone's files, and deleting a held lock file
    // lets a second job lease that GPU. Boot-time creation by root closes this (docs/design.md).
    dir.advice_.push_back(fmt::format(
        "lock directory {} is owned by {}, who can delete other users' lock files and so break "
        "their leases; have root create it at boot (contrib/tmpfiles.d/gpulock.conf) or run "
        "`sudo gpulock init`",
        p, user_name(st.st_uid)));
  }
  if ((st.st_mode & 0777) != 0777 || !(st.st_mode & S_ISVTX)) {
    dir.warnings_.push_back(fmt::format(
        "lock directory {} has mode {} (owner {}); other users need mode 1777 to lease GPUs here",
        p, mode_text(st.st_mode), user_name(st.st_uid)));
  }
  return dir;
}

std::string LockDirectory::lock_file_name(const std::string& uuid) {
  std::string safe;
  for (char c : uuid) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_';
    safe += ok ? c : '_';
  }
  return "gpu-" + safe + ".lock";
}

bool LockDirectory::is_lock_file_name(const std::string& name) {
  return name.size() > 9 && name.starts_with("gpu-") && name.ends_with(".lock");
}

std::filesystem::path LockDirectory::lock_file_path(const std::string& uuid) const {
  return path_ / lock_file_name(uuid);
}

UniqueFd LockDirectory::open_file(const std::string& name, bool for_writing,
                                  struct stat* opened) const {
  // The path, for messages only (built when one is needed: acquire is on a fast path).
  const auto full = [&] { return (path_ / name).string(); };
  const int access = for_writing ? O_RDWR : O_RDONLY;
  // O_NONBLOCK so that a planted FIFO cannot hang us.
  const int flags = access | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  for (int attempt = 0; attempt < 8; ++attempt) {
    UniqueFd fd(::openat(dir_fd_.get(), name.c_str(), flags));
    const bool missing = !fd && errno == ENOENT;
    if (missing) {
      if (!for_writing) return UniqueFd();
      // Made complete (mode 0666) before its name appears, so that another user never opens
      // it in the moment between creation and chmod and finds it unusable.
      UniqueFd unnamed(::openat(dir_fd_.get(), ".", O_TMPFILE | O_RDWR | O_CLOEXEC, kLockFileMode));
      if (unnamed && ::fchmod(unnamed.get(), kLockFileMode) == 0) {
        const std::string self = "/proc/self/fd/" + std::to_string(unnamed.get());
        // Either way, open it again by its name: the unnamed descriptor's close events would
        // carry its inode number instead of the lock file's name, and waiters would miss them.
        if (::linkat(AT_FDCWD, self.c_str(), dir_fd_.get(), name.c_str(), AT_SYMLINK_FOLLOW) == 0 ||
            errno == EEXIST)
          continue;
      }
    }
    if (missing && !fd) {
      // Where O_TMPFILE is not supported: create only when missing (O_EXCL): with
      // fs.protected_regular, O_CREAT on another user's existing file in a sticky directory fails
      // even when its mode would allow it.
      fd.reset(::openat(dir_fd_.get(), name.c_str(), flags | O_CREAT | O_EXCL, kLockFileMode));
      if (!fd && errno == EEXIST) continue;  // someone else created it just now
      if (!fd) {
        const int e = errno;
        environment_error(
            fmt::format("cannot create lock file {}: {}{}", full(), std::strerror(e),
                        e == ENOSPC ? " (the disk is full)"
                        : e == EROFS || e == EACCES
                            ? "; the lock directory must be writable by every user (mode 1777)"
                            : ""));
      }
      if (::fchmod(fd.get(), kLockFileMode) != 0)
        environment_error(errno_message("cannot set mode 0666 on " + full(), errno));
    }
    if (!fd) {
      const int e = errno;
      if (e == ELOOP) {
        environment_error(fmt::format(
            "{} is a symbolic link, not a lock file: refusing to follow it; whoever planted it "
            "can be found with `ls -l`, and root can remove it",
            full()));
      }
      if (e == EACCES) {
        struct stat st {};
        ::fstatat(dir_fd_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW);
        environment_error(fmt::format(
            "cannot open lock file {} (mode {}, owner {}): {}; ask its owner or root to run "
            "`chmod 666 {}`",
            full(), mode_text(st.st_mode), user_name(st.st_uid), std::strerror(e), full()));
      }
      environment_error(errno_message("cannot open lock file " + full(), e));
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0)
      environment_error(errno_message("cannot stat " + full(), errno));
    if (!S_ISREG(st.st_mode)) {
      environment_error(
          fmt::format("{} is not a regular file: refusing to use it as a lock file; "
                      "root can remove it",
                      full()));
    }
    if (st.st_nlink != 1 && (st.st_mode & 07777) != kLockFileMode) {
      // Someone's private file linked in, to have gpulock write over it. (A 0666 lock file
      // that someone hard-linked elsewhere is still locked, but gets no record written.)
      environment_error(fmt::format(
          "{} has {} hard links and mode {}: refusing to use it as a lock file (it may be "
          "someone's file linked in); root can remove it",
          full(), st.st_nlink, mode_text(st.st_mode)));
    }
    const bool shared_mode = (st.st_mode & kLockFileMode) == kLockFileMode;
    if (!shared_mode && st.st_uid == ::geteuid()) {
      if (for_writing) ::fchmod(fd.get(), kLockFileMode);  // repair our own file for others
    } else if (!shared_mode && ::geteuid() != 0) {
      // Readable but not lockable by us: say so now rather than when we try to lease it.
      environment_error(fmt::format(
          "lock file {} has mode {} (owner {}), so you cannot lock it; ask {} or root to run "
          "`chmod 666 {}`",
          full(), mode_text(st.st_mode), user_name(st.st_uid), user_name(st.st_uid), full()));
    }
    // O_NONBLOCK stays set: on a regular file it changes nothing for locks or I/O.
    if (fd.get() <= 2) {
      // Our caller runs with stdin/stdout/stderr closed: a lock fd there would be taken for one
      // (and a child's output written into the shared lock file). Move it out of the way.
      UniqueFd moved(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3));
      if (!moved)
        environment_error(errno_message("cannot duplicate descriptor of " + full(), errno));
      fd = std::move(moved);
    }
    if (opened) *opened = st;
    return fd;
  }
  environment_error("cannot open lock file " + full() + ": it keeps appearing and disappearing");
}

UniqueFd LockDirectory::open_lock_file(const std::string& uuid, struct stat* opened) const {
  return open_file(lock_file_name(uuid), true, opened);
}

UniqueFd LockDirectory::open_lock_file_for_reading(const std::string& uuid,
                                                   struct stat* opened) const {
  return open_file(lock_file_name(uuid), false, opened);
}

void LockDirectory::prepare(const std::vector<std::string>& uuids) const {
  const bool root = ::geteuid() == 0;
  const auto make_root_owned = [&](int fd, mode_t mode, const std::string& what) {
    if (!root) return;
    if (::fchown(fd, 0, 0) != 0 || ::fchmod(fd, mode) != 0)
      environment_error(errno_message("cannot make " + what + " root-owned", errno));
  };
  make_root_owned(dir_fd_.get(), kSharedDirMode, path_.string());
  make_root_owned(open_acquire_mutex().get(), kLockFileMode, "the acquire mutex file");
  make_root_owned(open_shared_file(kDeparturesName).get(), kLockFileMode,
                  "the queue's departures file");
  for (const auto& uuid : uuids)
    make_root_owned(open_lock_file(uuid).get(), kLockFileMode, lock_file_path(uuid).string());
}

std::optional<nlink_t> LockDirectory::links_if_current(const struct stat& opened,
                                                       const std::string& uuid) const {
  struct stat named {};
  if (::fstatat(dir_fd_.get(), lock_file_name(uuid).c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0)
    return std::nullopt;
  if (opened.st_dev != named.st_dev || opened.st_ino != named.st_ino) return std::nullopt;
  return named.st_nlink;
}

UniqueFd LockDirectory::open_acquire_mutex() const {
  return open_file(kAcquireMutexName, true);
}

UniqueFd LockDirectory::open_departures_beacon() const {
  try {
    return open_file(kDeparturesName, true);
  } catch (const Error&) {
    return UniqueFd();  // a planted or unusable file: announced by nobody, noticed all the same
  }
}

LockDirectory LockDirectory::duplicate() const {
  UniqueFd copy(::fcntl(dir_fd_.get(), F_DUPFD_CLOEXEC, 3));
  if (!copy)
    environment_error(errno_message("cannot duplicate descriptor of " + path_.string(), errno));
  LockDirectory handle(path_, std::move(copy));
  handle.warnings_ = warnings_;
  handle.advice_ = advice_;
  return handle;
}

}  // namespace gpulock
