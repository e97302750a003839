// A host's GPU registrations packed in one string (the `gpus` field of `host:<H>`, written by the
// register script), so that a snapshot reads a host in one HMGET instead of one per GPU: fields
// "<length>:<bytes>" one after the other, the read time first, then per GPU its UUID, static
// info and readings (device_record.h). Anyone who may write the pool's keys can write it: a
// package that is not exactly that is unreadable as a whole.
#pragma once

#include <optional>
#include <string_view>
#include <unordered_map>

namespace gpulock {

struct PackedRegistration {
  std::string_view static_json;
  std::string_view readings_json;
};

// By UUID (the last of a UUID packed twice); the views point into `packed`. nullopt when the
// package is malformed.
std::optional<std::unordered_map<std::string_view, PackedRegistration>> unpack_registrations(
    std::string_view packed);

}  // namespace gpulock
