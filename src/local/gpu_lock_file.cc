// OFD lock operations and record I/O on lock files.
#include "local/gpu_lock_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>

#include "backend/holder_record.h"
#include "gpulock/error.hpp"
#include "util/fd.h"

namespace gpulock {
namespace {

struct flock whole_file(short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = 0;
  lock.l_len = 0;  // to the end of the file, however long it grows
  lock.l_pid = 0;  // must be 0 for OFD locks
  return lock;
}

}  // namespace

bool try_lock_exclusive(int fd) {
  struct flock lock = whole_file(F_WRLCK);
  while (::fcntl(fd, F_OFD_SETLK, &lock) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EACCES) return false;
    throw Error(ErrorCode::kInternal, errno_message("fcntl(F_OFD_SETLK)", errno));
  }
  return true;
}

void lock_exclusive(int fd) {
  struct flock lock = whole_file(F_WRLCK);
  while (::fcntl(fd, F_OFD_SETLKW, &lock) != 0) {
    if (errno == EINTR) continue;
    throw Error(ErrorCode::kInternal, errno_message("fcntl(F_OFD_SETLKW)", errno));
  }
}

void unlock(int fd) {
  struct flock lock = whole_file(F_UNLCK);
  while (::fcntl(fd, F_OFD_SETLK, &lock) != 0 && errno == EINTR) {
  }
}

bool is_locked_elsewhere(int fd) {
  struct flock lock = whole_file(F_WRLCK);
  while (::fcntl(fd, F_OFD_GETLK, &lock) != 0) {
    if (errno == EINTR) continue;
    throw Error(ErrorCode::kInternal, errno_message("fcntl(F_OFD_GETLK)", errno));
  }
  return lock.l_type != F_UNLCK;
}

LockMode held_mode(int fd) {
  struct flock lock = whole_file(F_WRLCK);
  lock.l_len = 1;
  while (::fcntl(fd, F_OFD_GETLK, &lock) != 0) {
    if (errno == EINTR) continue;
    throw Error(ErrorCode::kInternal, errno_message("fcntl(F_OFD_GETLK)", errno));
  }
  if (lock.l_type == F_UNLCK) return LockMode::kNone;
  return lock.l_type == F_RDLCK ? LockMode::kShared : LockMode::kExclusive;
}

std::vector<std::pair<off_t, off_t>> held_ranges(int fd, off_t from, off_t len) {
  // The first conflicting lock F_OFD_GETLK reports over [start, stop) is the first in the
  // kernel's list, which is not ordered by offset across owners: it may lie after other held
  // ranges. Narrow the probe to the bytes before it until none is held there.
  const auto first_conflict = [fd](off_t start,
                                   off_t stop) -> std::optional<std::pair<off_t, off_t>> {
    struct flock lock = whole_file(F_WRLCK);
    lock.l_start = start;
    lock.l_len = stop - start;
    while (::fcntl(fd, F_OFD_GETLK, &lock) != 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kInternal, errno_message("fcntl(F_OFD_GETLK)", errno));
    }
    if (lock.l_type == F_UNLCK) return std::nullopt;
    // The kernel reports the lock as its holder has it: clip it to the range asked about.
    const off_t first = std::max(lock.l_start, start);
    const off_t last = lock.l_len == 0 ? stop : std::min(stop, lock.l_start + lock.l_len);
    if (last <= first) return std::nullopt;  // cannot happen; never loop forever on a surprise
    return std::make_pair(first, last);
  };
  std::vector<std::pair<off_t, off_t>> held;
  const off_t end = from + len;
  off_t pos = from;
  while (pos < end) {
    std::optional<std::pair<off_t, off_t>> found = first_conflict(pos, end);
    if (!found) break;
    // Each narrowing ends before the range found, so this ends.
    while (found->first > pos) {
      const auto earlier = first_conflict(pos, found->first);
      if (!earlier) break;
      found = earlier;
    }
    held.emplace_back(found->first, found->second - found->first);
    pos = found->second;
  }
  return held;
}

bool try_lock_range(int fd, short type, off_t start, off_t len) {
  struct flock lock = whole_file(type);
  lock.l_start = start;
  lock.l_len = len;
  while (::fcntl(fd, F_OFD_SETLK, &lock) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EACCES) return false;
    throw Error(ErrorCode::kInternal, errno_message("fcntl(F_OFD_SETLK)", errno));
  }
  return true;
}

std::string read_record_bytes(int fd, off_t offset) {
  std::string bytes(kHolderRecordSize, '\0');
  ssize_t n;
  do {
    n = ::pread(fd, bytes.data(), bytes.size(), offset);
  } while (n < 0 && errno == EINTR);
  bytes.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return bytes;
}

std::optional<std::string> write_record_bytes(int fd, const std::string& bytes, off_t offset) {
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::pwrite(fd, bytes.data() + written, bytes.size() - written,
                               offset + static_cast<off_t>(written));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_message("cannot write lease details", errno);
    }
    written += static_cast<std::size_t>(n);
  }
  return std::nullopt;
}

}  // namespace gpulock
