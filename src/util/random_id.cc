// Random identifiers for leases, from getrandom(2) (util/random_id.h).
#include "util/random_id.h"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "gpulock/error.hpp"
#include "util/current_pid.h"
#include "util/fd.h"

namespace gpulock {

namespace {

// Random bytes from getrandom(2), fetched 256 at a time per thread: a lease id costs a system
// call once in 32 (~1 µs each on a virtual machine) and stays the kernel's randomness. A fork
// child drops what it inherited, so that it never hands out its parent's next ids.
struct RandomBytes {
  pid_t owner = 0;  // 0: nothing fetched yet
  std::size_t used = 0;
  std::array<unsigned char, 256> bytes{};

  void take(unsigned char* out, std::size_t count) {
    if (owner != current_pid() || bytes.size() - used < count) refill();
    std::memcpy(out, bytes.data() + used, count);
    used += count;
  }

  void refill() {
    std::size_t filled = 0;
    while (filled < bytes.size()) {
      const ssize_t n = ::getrandom(bytes.data() + filled, bytes.size() - filled, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(ErrorCode::kInternal, errno_message("getrandom", errno));
      }
      filled += static_cast<std::size_t>(n);
    }
    owner = current_pid();
    used = 0;
  }
};

}  // namespace

std::string make_lease_id() {
  thread_local RandomBytes random;
  std::uint64_t value = 0;
  random.take(reinterpret_cast<unsigned char*>(&value), sizeof value);
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
