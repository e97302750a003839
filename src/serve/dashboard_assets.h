// The dashboard's files (src/serve/assets/), embedded into the binary at build time by
// cmake/embed_assets.cmake, so `gpulock serve` needs no files beside it and no network.
#pragma once

#include <string_view>
#include <vector>

namespace gpulock::serve {

struct Asset {
  std::string_view name;          // "index.html", "dashboard.js", ...
  std::string_view content_type;  // "text/html; charset=utf-8", ...
  std::string_view body;
};

const std::vector<Asset>& dashboard_assets();

}  // namespace gpulock::serve
