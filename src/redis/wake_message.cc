// Reading the wakes of the Redis queue (redis/wake_message.h).
#include "redis/wake_message.h"

#include "util/strings.h"

namespace gpulock {

std::uint64_t parse_server_us(std::string_view text) {
  return whole_number<std::uint64_t>(text).value_or(0);
}

std::optional<PoolMoment> parse_wake_message(std::string_view text) {
  const std::size_t space = text.find(' ');
  if (space == std::string_view::npos || space == 0) return std::nullopt;
  PoolMoment moment{std::string(text.substr(0, space)), parse_server_us(text.substr(space + 1))};
  if (moment.server_us == 0) return std::nullopt;
  return moment;
}

bool wake_is_news(std::string_view wake, const PoolMoment& planned) {
  if (planned.server_us == 0 || planned.version.empty()) return true;
  const std::optional<PoolMoment> pushed = parse_wake_message(wake);
  return !pushed || pushed->version != planned.version || pushed->server_us >= planned.server_us;
}

}  // namespace gpulock
