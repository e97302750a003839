// Random identifiers for leases, from getrandom(2).
#include "util/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>

#include "gpulock/error.hpp"
#include "util/fd.h"

namespace gpulock {

std::string make_lease_id() {
  std::uint64_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  std::size_t filled = 0;
  while (filled < sizeof value) {
    const ssize_t n = ::getrandom(bytes + filled, sizeof value - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kInternal, errno_message("getrandom", errno));
    }
    filled += static_cast<std::size_t>(n);
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

bool is_lease_id(std::string_view text) {
  if (text.size() != 16) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace gpulock
