// LockDirectory: the machine-wide directory of GPU lock files, shared by every user.
//
// One lock file per GPU, named after its UUID (never its index, which can change across
// reboots). Files are created once and never deleted: deleting a file that others may have
// open or locked breaks exclusion. Every open is relative to the directory's descriptor, with
// O_NOFOLLOW and O_CLOEXEC, and checks that it got a plain regular file, so planted symlinks,
// FIFOs or hard links are refused with a clear message instead of being followed.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "util/fd.h"

namespace gpulock {

class LockDirectory {
 public:
  // Opens the directory, creating it (mode 1777, whatever the umask) if missing. Throws
  // Error(kEnvironment) if it is unusable: a symlink, not a directory, on NFS/SMB, or missing
  // and impossible to create.
  static LockDirectory open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  int fd() const { return dir_fd_.get(); }
  // Notes for people about a usable but doubtful set-up (e.g. a mode that shuts others out).
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Notes for administrators (shown by `gpulock status`, not on every lease).
  const std::vector<std::string>& advice() const { return advice_; }

  // Creates every listed GPU's lock file if missing and, when run as root, makes the directory
  // and the files root-owned so that no user can delete them (`gpulock init`).
  void prepare(const std::vector<std::string>& uuids) const;

  // The lock file of a GPU, opened read-write for locking; created (mode 0666) when missing.
  // Throws Error(kEnvironment) naming the file and what to do when it cannot be used.
  // `opened`, when given, receives the file's fstat as checked here.
  UniqueFd open_lock_file(const std::string& uuid, struct stat* opened = nullptr) const;

  // The lock file of a GPU opened read-only, to inspect it without disturbing anyone.
  // An invalid fd means the file does not exist (so nobody holds that GPU). Throws like
  // open_lock_file for a file that is not a plain regular file. `opened`, when given, receives
  // the file's fstat as checked here.
  UniqueFd open_lock_file_for_reading(const std::string& uuid, struct stat* opened = nullptr) const;

  // The number of hard links of the file under the GPU's lock-file name if that is still the
  // file `opened` describes (open_lock_file's fstat), else nullopt. A lock taken on a file that
  // was deleted or replaced after it was opened protects nothing and must be dropped. One
  // fstatat: the opened file's identity cannot change.
  std::optional<nlink_t> links_if_current(const struct stat& opened, const std::string& uuid) const;

  // The file whose lock serialises acquisitions machine-wide (".acquire.lock").
  static constexpr const char* kAcquireMutexName = ".acquire.lock";
  UniqueFd open_acquire_mutex() const;

  // The file whose closes announce that a waiter left the queue (".queue.departures", mode
  // 0666): each waiter keeps a descriptor of its own open on it while it waits, and the close of
  // that descriptor, by leaving or by dying, is an IN_CLOSE_WRITE in this directory, which the
  // dispatchers watch for releases anyway. (The queue directory itself is not watched: adding
  // the first watch on a directory marks every child dentry, thousands there, and every open in
  // a watched directory takes its dentry's lock.) Opened read-write, created when missing; an
  // empty descriptor where it cannot be used: departures then go unannounced, and the ring of
  // waiters and the oldest waiter's re-check notice them instead.
  static constexpr const char* kDeparturesName = ".queue.departures";
  UniqueFd open_departures_beacon() const;

  // Another handle on the same directory (its descriptor duplicated).
  LockDirectory duplicate() const;

  // Another file shared read-write by every user (mode 0666), created complete when missing,
  // with the same checks as a lock file.
  UniqueFd open_shared_file(const std::string& name) const { return open_file(name, true); }

  std::filesystem::path lock_file_path(const std::string& uuid) const;

  // True for names of GPU lock files ("gpu-<uuid>.lock").
  static bool is_lock_file_name(const std::string& name);
  static std::string lock_file_name(const std::string& uuid);

 private:
  LockDirectory(std::filesystem::path path, UniqueFd dir_fd)
      : path_(std::move(path)), dir_fd_(std::move(dir_fd)) {}
  UniqueFd open_file(const std::string& name, bool for_writing,
                     struct stat* opened = nullptr) const;

  std::filesystem::path path_;
  UniqueFd dir_fd_;
  std::vector<std::string> warnings_;
  std::vector<std::string> advice_;
};

// GPULOCK_DIR if set; else /run/lock/gpulock where /run/lock is shared by everyone (or the
// directory already exists there); else /var/tmp/gpulock. Every user of the machine arrives at
// the same answer for the same file system state.
std::filesystem::path default_lock_directory();

}  // namespace gpulock
