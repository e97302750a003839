// A reader for the flat JSON objects a host registers its GPUs with (device_record.h), without
// building a DOM: an object whose values are strings, unsigned or real numbers, booleans, null,
// or arrays of such objects (one level). Parsing a 100-host pool's 800 registrations with
// nlohmann's DOM took ~3 ms of a one-shot `gpulock status --pool`; this takes a fraction.
//
// It declines (nullopt) whatever it does not read exactly as a full JSON parser would: escapes
// in strings, bytes outside printable ASCII in strings, negative numbers, integers beyond 64 bits,
// nested objects, deeper arrays, and anything that is not JSON. Callers then use the full parser,
// which also rejects what is not JSON: so a document this accepts yields the same values as
// nlohmann::json::parse(), and one it declines is judged by nlohmann.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace gpulock {

struct FlatJsonValue;

struct FlatJsonObject {
  std::vector<std::string_view> keys;
  std::vector<FlatJsonValue> values;  // values[i] belongs to keys[i]

  // The value of `key` (the last one, as a full parser keeps, if the key repeats), or null.
  const FlatJsonValue* find(std::string_view key) const;
};

struct FlatJsonValue {
  enum class Kind { kNull, kBool, kUnsigned, kReal, kString, kArray };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::uint64_t unsigned_number = 0;    // kUnsigned
  double real = 0;                      // kReal; kUnsigned also sets it, as a double
  std::string_view text;                // kString: the characters between the quotes
  std::vector<FlatJsonObject> objects;  // kArray
};

// The object in `json` (which the result's views point into), or nullopt where it declines.
std::optional<FlatJsonObject> parse_flat_json(std::string_view json);

}  // namespace gpulock
