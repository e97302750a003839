// Seconds since the Unix epoch (as stored in holder records, tickets and JSON) and back.
#pragma once

#include <chrono>

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

}  // namespace gpulock
