// Kernel locks on lock files: open-file-description (OFD) locks, the heart of gpulock.
//
// An OFD lock belongs to the open file description, not to a process: it is shared by every
// descriptor dup()ed or inherited from it (fork, exec) and released by the kernel when the last
// of them is closed, which happens whenever the processes holding them end, SIGKILL and OOM
// kills included. So a lease can never go stale. Unlike classic POSIX fcntl locks, closing some
// other descriptor of the same file does not drop it, and unlike flock, the lock can be queried
// (F_OFD_GETLK) without taking it, so `gpulock status` never disturbs a holder.
#pragma once

#include <optional>
#include <string>

namespace gpulock {

// Takes an exclusive lock on the whole file without waiting; false if someone holds it.
bool try_lock_exclusive(int fd);

// Takes an exclusive lock on the whole file, waiting as long as it takes.
void lock_exclusive(int fd);

void unlock(int fd);

// True if a lock held through another open file description would conflict with ours.
// Works on a read-only descriptor and takes nothing.
bool is_locked_elsewhere(int fd);

// The holder record stored in the file (at most kHolderRecordSize bytes), as raw bytes.
std::string read_record_bytes(int fd);

// Replaces the record in one write. Returns an error text on failure (e.g. disk full): the
// lock itself is unaffected, only the details shown to others are missing.
std::optional<std::string> write_record_bytes(int fd, const std::string& bytes);

}  // namespace gpulock
