// CUDA_VISIBLE_DEVICES: reading the caller's value (to limit candidates) and writing ours.
//
// CUDA reads the list left to right: indices, or UUIDs ("GPU-…", "MIG-…", unique prefixes
// allowed); an entry it cannot parse ends the list, and an empty value hides every GPU. An
// existing value is intersected with, never overwritten: gpulock only ever grants a subset.
#pragma once

#include <string>
#include <vector>

#include "gpulock/device.hpp"
#include "gpulock/lease.hpp"

namespace gpulock {

// True if the device is visible under the given CUDA_VISIBLE_DEVICES value.
bool visible_under(const Device& device, const std::string& cuda_visible_devices);

std::string format_visible_devices(const std::vector<LeasedGpu>& gpus, VisibleFormat format);

}  // namespace gpulock
