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
  // All sixteen characters at once (GCC's vector extension, on any target): the queue checks
  // thousands of ids per plan. As signed bytes, anything from 0x80 up is below '0'.
  using Bytes = signed char __attribute__((vector_size(16)));
  Bytes chars;
  std::memcpy(&chars, text.data(), sizeof chars);
  const Bytes hex = ((chars >= '0') & (chars <= '9')) | ((chars >= 'a') & (chars <= 'f'));
  std::uint64_t halves[2];
  std::memcpy(halves, &hex, sizeof halves);
  return (halves[0] & halves[1]) == ~std::uint64_t{0};
}

}  // namespace gpulock
