// Random identifiers for leases, from getrandom(2).
#include "util/random_id.h"

#include <sys/random.h>

#include <array>
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
  // A table and no branch per character: the queue checks thousands of ids per plan.
  static constexpr std::array<bool, 256> kLowerHex = [] {
    std::array<bool, 256> table{};
    for (unsigned char c = '0'; c <= '9'; ++c) table[c] = true;
    for (unsigned char c = 'a'; c <= 'f'; ++c) table[c] = true;
    return table;
  }();
  bool valid = true;
  for (const char c : text) valid &= kLowerHex[static_cast<unsigned char>(c)];
  return valid;
}

}  // namespace gpulock
