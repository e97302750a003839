// unpack_registrations() (packed_registrations.h): "<length>:<bytes>" fields, checked.
#include "redis/packed_registrations.h"

#include <charconv>
#include <vector>

namespace gpulock {

std::optional<std::unordered_map<std::string_view, PackedRegistration>> unpack_registrations(
    std::string_view packed) {
  std::vector<std::string_view> fields;
  while (!packed.empty()) {
    const std::size_t colon = packed.find(':');
    if (colon == std::string_view::npos || colon == 0 || colon > 9) return std::nullopt;
    std::size_t length = 0;
    const auto [end, error] = std::from_chars(packed.data(), packed.data() + colon, length);
    if (error != std::errc() || end != packed.data() + colon || length > packed.size() - colon - 1)
      return std::nullopt;
    fields.push_back(packed.substr(colon + 1, length));
    packed.remove_prefix(colon + 1 + length);
  }
  if (fields.empty() || (fields.size() - 1) % 3 != 0) return std::nullopt;
  std::unordered_map<std::string_view, PackedRegistration> by_uuid;
  by_uuid.reserve((fields.size() - 1) / 3);
  for (std::size_t i = 1; i + 2 < fields.size(); i += 3)
    by_uuid[fields[i]] = PackedRegistration{fields[i + 1], fields[i + 2]};
  return by_uuid;
}

}  // namespace gpulock
