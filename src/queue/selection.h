// Choosing which N of the free GPUs to lease.
//
// Preference, in order: GPUs close together (smallest largest pairwise topology distance, then
// smallest total), then the earliest in the given order (index order, unless the caller orders
// them otherwise), so choices are stable and predictable.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gpulock {

using DistanceFunction = std::function<int(const std::string& uuid_a, const std::string& uuid_b)>;

// `free_uuids` is in preference (index) order. Returns positions into it, ascending, or nullopt
// when there are fewer than `count`.
std::optional<std::vector<std::size_t>> choose_gpus(const std::vector<std::string>& free_uuids,
                                                    std::size_t count,
                                                    const DistanceFunction& distance);

}  // namespace gpulock
