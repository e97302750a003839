// Fencing tokens as Redis keeps them: the decimal text of a count, read back as untrusted input
// (anyone with write access to the pool's keys can put anything in the `token` key).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace gpulock {

// The acquire script computes the next token with Lua numbers (doubles), which count exactly
// only up to 2^53: above that, two leases could get the same token.
inline constexpr std::uint64_t kExactTokenLimit = std::uint64_t{1} << 53;

// The token in `text`: 1 to 20 decimal digits, no sign, no leading zero, at most 2^64 - 1.
// nullopt for anything else.
std::optional<std::uint64_t> parse_fencing_token(std::string_view text);

}  // namespace gpulock
