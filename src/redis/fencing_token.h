// Fencing tokens as Redis keeps them: the decimal text of a count, read back as untrusted input
// (anyone with write access to the pool's keys can put anything in the `token` key).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "gpulock/error.hpp"
#include "redis/redis_connection.h"
#include "redis/redis_settings.h"

namespace gpulock {

// The largest token: the acquire script counts in decimal text up to it, and issues none after.
inline constexpr std::uint64_t kLastFencingToken = ~std::uint64_t{0};

// The token in `text`: 1 to 20 decimal digits, no sign, no leading zero, at most 2^64 - 1.
// nullopt for anything else.
std::optional<std::uint64_t> parse_fencing_token(std::string_view text);

// What an acquire throws when its script replied {"exhausted", last token, key}: the pool's
// token counter is at the largest token, so no lease can get a larger one until the pool is
// repaired. The key is the one that holds it, less the prefix ("token" or "token_copy"; an
// older script's reply without it names "token").
Error fencing_tokens_exhausted(const RedisSettings& settings, const RedisValue& reply);

}  // namespace gpulock
