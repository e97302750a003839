// Sealing the local usage journal's files append-only (Linux's FS_APPEND_FL inode flag).
//
// A sealed file can be opened for writing only with O_APPEND, and cannot be truncated, renamed,
// unlinked or linked to, even by its owner; only a process with CAP_LINUX_IMMUTABLE (root) sets
// or clears the flag (ioctl_iflags(2), chattr(1)). Every user's gpulock creates and appends to its
// own file; root (`gpulock init`, `gpulock journal seal` from a timer) seals the files and rotates
// those past the size limit, since a sealed file cannot be renamed by its owner. What this does and
// does not guarantee is in docs/operations.md ("Sealing the journal").
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "gpulock/doctor.hpp"
#include "gpulock/usage.hpp"

namespace gpulock {

enum class SealState {
  kSealed,       // append-only
  kUnsealed,     // its owner may rewrite it
  kUnsupported,  // the file system has no append-only flag (tmpfs before Linux 6.0, NFS, ...)
};

// The append-only state of the file (or directory) open as `fd`; kUnsupported also where the
// flags cannot be read at all (`error` then says why).
SealState seal_state(int fd, int* error = nullptr) noexcept;

// Sets or clears the flag (other inode flags are kept). Returns 0 or an errno value: EPERM
// without CAP_LINUX_IMMUTABLE, ENOTTY or EOPNOTSUPP where the file system lacks the flag.
int set_sealed(int fd, bool sealed) noexcept;

// As root: seals every journal file of `directory` that is a plain file of the user its name
// says ("usage-<uid>.log", "usage-<uid>-<...>.log"; anything else is left alone and reported),
// and rotates each current file ("usage-<uid>.log") at or past `max_file_bytes`: renamed to
// "usage-<uid>-<time>-<id>.log" and sealed again, a new current file made for the user (owned by
// them, mode 0644, sealed). Fixes the mode of a file that is not 0644. Processes holding a
// journal file open for writing without O_APPEND are reported as problems
// (journal/journal_rewriters.h). Throws
// Error(kPermissionDenied) when not root, Error(kEnvironment) when the directory cannot be opened.
JournalSealReport seal_journal_directory(const std::filesystem::path& directory,
                                         std::uint64_t max_file_bytes);

// `gpulock doctor`'s check of the seals, for a journal directory owned by root (a user's own
// journal has nobody to seal it: nullopt): a warning naming the files that are not sealed, or
// saying that the file system cannot seal them.
std::optional<DoctorCheck> journal_seal_check(const std::filesystem::path& directory);

}  // namespace gpulock
