// UsageDocuments: the documents `gpulock serve` answers /api/usage with, from the usage journal.
//
// `by` is one of `gpulock usage --by`'s groupings (the same JSON as `gpulock usage --json`), or
// "user,day" for the dashboard's chart: {"since", "until", "rows": [{"user", "day",
// "gpu_hours"}]}, each UTC day of the window summed per user. Reading the journal costs what
// `gpulock usage` costs, so a document is kept for `max_age` and every open dashboard shares it;
// the journal is read through a pool of this object's own, one request at a time (the server's
// status thread keeps its pool to itself).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "gpulock/gpu_pool.hpp"

namespace gpulock::serve {

class UsageDocuments {
 public:
  // `open_pool` opens the pool to read the journal through (called once, when first needed).
  UsageDocuments(std::function<GpuPool()> open_pool,
                 std::chrono::seconds max_age = std::chrono::seconds(30));

  // The document for `since` ("28d", a date: as `gpulock usage --since`) and `by`. Throws
  // Error(kInvalidArgument) for a value it refuses.
  std::string document(const std::string& since, const std::string& by);

 private:
  std::string build(double since, double until, const std::string& by);

  std::function<GpuPool()> open_pool_;
  std::chrono::seconds max_age_;
  std::mutex mutex_;
  std::optional<GpuPool> pool_;
  struct Kept {
    std::chrono::steady_clock::time_point made;
    std::string document;
  };
  std::map<std::pair<std::string, std::string>, Kept> kept_;
};

}  // namespace gpulock::serve
