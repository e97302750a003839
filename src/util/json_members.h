// Typed members of a JSON object read with nlohmann's parser, for files read as untrusted input
// (queue tickets, holder records): each is nullopt when the member is missing or of another
// type. Strings are views into the document, which must outlive them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace gpulock::json_members {

inline std::optional<std::string_view> string_member(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string()) return std::nullopt;
  return std::string_view(j[key].get_ref<const std::string&>());
}

// A JSON integer without sign or fraction.
inline std::optional<std::uint64_t> unsigned_member(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number_unsigned()) return std::nullopt;
  return j[key].get<std::uint64_t>();
}

inline std::optional<bool> bool_member(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_boolean()) return std::nullopt;
  return j[key].get<bool>();
}

// Any JSON number.
inline std::optional<double> number_member(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

// Member `key` read with `read` (one of the above) into `out`; false if missing or of another
// type.
template <typename Read, typename T>
bool required(const nlohmann::json& j, const char* key, Read read, T& out) {
  const auto value = read(j, key);
  if (value) out = *value;
  return value.has_value();
}

// An optional member: true when absent (`out` untouched) or present with the right type.
template <typename Read, typename T>
bool optional(const nlohmann::json& j, const char* key, Read read, std::optional<T>& out) {
  if (!j.contains(key)) return true;
  out = read(j, key);
  return out.has_value();
}

}  // namespace gpulock::json_members
