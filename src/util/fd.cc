// UniqueFd and errno helpers.
#include "util/fd.h"

#include <unistd.h>

#include <cstring>

namespace gpulock {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close() errors on a lock fd carry no information we can act on
  fd_ = fd;
}

std::string errno_message(const std::string& what, int errno_value) {
  return what + ": " + std::strerror(errno_value);
}

}  // namespace gpulock
