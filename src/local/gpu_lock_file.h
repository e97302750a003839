// Kernel locks on lock files: open-file-description (OFD) locks, the heart of gpulock.
//
// An OFD lock belongs to the open file description, not to a process: it is shared by every
// descriptor dup()ed or inherited from it (fork, exec) and released by the kernel when the last
// of them is closed, which happens whenever the processes holding them end, SIGKILL and OOM
// kills included. So a lease can never go stale. Unlike classic POSIX fcntl locks, closing some
// other descriptor of the same file does not drop it, and unlike flock, the lock can be queried
// (F_OFD_GETLK) without taking it, so `gpulock status` never disturbs a holder.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gpulock {

// Takes an exclusive lock on the whole file without waiting; false if someone holds it.
bool try_lock_exclusive(int fd);

// Takes an exclusive lock on the whole file, waiting as long as it takes.
void lock_exclusive(int fd);

void unlock(int fd);

// True if a lock held through another open file description would conflict with ours.
// Works on a read-only descriptor and takes nothing.
bool is_locked_elsewhere(int fd);

// Shared leases (several jobs on one GPU by memory) use byte ranges of the same file; the layout
// (see docs/design.md, "Shared leases"):
//   byte 0                      read-locked by every shared lease: "in shared use". An
//                               exclusive lease write-locks the whole file, so the two exclude
//                               each other, and F_OFD_GETLK on byte 0 tells which mode holds it.
//   kSharedUnitLockBase + u     write-locked by the shared lease that reserves memory unit u
//                               (kSharedUnitBytes each).
//   kSharedSlotLockBase + s     write-locked by the shared lease whose record is in slot s (s is
//                               its first unit): the record is believed only while this is locked.
//   kSharedRecordBase + s*4096  that record (the exclusive record stays at offset 0).
inline constexpr std::uint64_t kSharedUnitBytes = 256ull << 20;  // 256 MiB
inline constexpr off_t kSharedMaxUnits = 8192;                   // 2 TiB of GPU memory
inline constexpr off_t kSharedUnitLockBase = 4096;
inline constexpr off_t kSharedSlotLockBase = kSharedUnitLockBase + kSharedMaxUnits;
inline constexpr off_t kSharedRecordBase = 64 * 1024;

enum class LockMode { kNone, kExclusive, kShared };

// Which kind of lease holds the file now (through another open file description).
LockMode held_mode(int fd);

// The ranges [start, start + len) of bytes in [from, from + len) that another open file
// description has locked, in order: one F_OFD_GETLK per held range, and more where locks were
// taken out of offset order.
std::vector<std::pair<off_t, off_t>> held_ranges(int fd, off_t from, off_t len);

// Locks bytes [start, start + len) without waiting (type F_RDLCK or F_WRLCK); false if held.
bool try_lock_range(int fd, short type, off_t start, off_t len);

// The holder record stored in the file (at most kHolderRecordSize bytes), as raw bytes.
std::string read_record_bytes(int fd, off_t offset = 0);

// Replaces the record in one write. Returns an error text on failure (e.g. disk full): the
// lock itself is unaffected, only the details shown to others are missing.
std::optional<std::string> write_record_bytes(int fd, const std::string& bytes, off_t offset = 0);

}  // namespace gpulock
