// Reading a fencing token back from Redis (redis/fencing_token.h).
#include "redis/fencing_token.h"

#include <charconv>

#include <fmt/format.h>

#include "util/strings.h"

namespace gpulock {

std::optional<std::uint64_t> parse_fencing_token(std::string_view text) {
  if (text.empty() || text.size() > 20 || (text.size() > 1 && text[0] == '0')) return std::nullopt;
  for (const char c : text)
    if (c < '0' || c > '9') return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

Error fencing_tokens_exhausted(const RedisSettings& settings, const RedisValue& reply) {
  const std::string_view counter =
      reply.elements.size() > 1 ? std::string_view(reply.elements[1].text) : "?";
  const std::string_view key =
      reply.elements.size() > 2 && reply.elements[2].text == "token_copy" ? "token_copy" : "token";
  return Error(
      ErrorCode::kEnvironment,
      fmt::format("pool '{}': its fencing-token counter ({}{}) is at {}, the largest "
                  "64-bit token, so no lease can get a larger one; an administrator must "
                  "repair the pool (see `gpulock doctor`)",
                  settings.pool, settings.prefix(), key, sanitize_for_display(counter, 40)));
}

}  // namespace gpulock
