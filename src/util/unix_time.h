// Seconds since the Unix epoch (as stored in holder records, tickets and JSON) and back, and a
// file's modification time in nanoseconds since it.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstdint>

namespace gpulock {

inline double unix_seconds(std::chrono::system_clock::time_point when) {
  return std::chrono::duration<double>(when.time_since_epoch()).count();
}

// REQUIRES: seconds within what the clock can represent (records and tickets are validated so).
inline std::chrono::system_clock::time_point from_unix_seconds(double seconds) {
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(seconds)));
}

// The modification time `st` gives, in nanoseconds since the Unix epoch.
inline std::int64_t modified_unix_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace gpulock
