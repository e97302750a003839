// UniqueFd and errno helpers.
#include "util/fd.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpulock {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close() errors on a lock fd carry no information we can act on
  fd_ = fd;
}

std::string errno_message(const std::string& what, int errno_value) {
  return what + ": " + std::strerror(errno_value);
}

std::string read_prefix(int fd, std::size_t limit) {
  // The buffer grows as the file turns out longer: a few-byte record must not cost a zeroed
  // buffer of the whole limit (a megabyte per record read when `gpulock jobs` lists a store).
  std::string bytes(std::min<std::size_t>(limit, 4096), '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == bytes.size()) {
      if (bytes.size() == limit) break;
      bytes.resize(std::min(limit, bytes.size() * 2));
    }
    const ssize_t n = ::pread(fd, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  bytes.resize(got);
  return bytes;
}

}  // namespace gpulock
