// What a wake pushed to a Redis waiter's list says, and whether it tells the waiter anything its
// last snapshot did not: a wake that is old news costs a needless snapshot and plan.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpulock {

// The pool as a reader saw it: its version and the server's clock (microseconds) at that moment.
struct PoolMoment {
  std::string version;
  std::uint64_t server_us = 0;
};

// The moment in a wake, "VERSION NOW_US" as the scripts push it; nullopt for anything else (a
// wake of an older gpulock, which pushed "1", or garbage): that one is always news.
std::optional<PoolMoment> parse_wake_message(std::string_view text);

// The server's clock as the scripts give it (decimal microseconds); 0 when it is not that.
std::uint64_t parse_server_us(std::string_view text);

// Whether a waiter whose last snapshot was taken at `planned` must plan again for `wake`. Not
// when the wake was pushed before that snapshot with the pool at the same version: every script
// bumps the version before it wakes, and nothing that changes a plan happens without a bump, so
// the snapshot already saw all the wake tells of. Anything else is news, on the safe side: a
// version that differs (even after a restart reset it), the same server microsecond, a clock
// that is unknown (0).
bool wake_is_news(std::string_view wake, const PoolMoment& planned);

}  // namespace gpulock
