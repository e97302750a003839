// Whether a device can serve a request: never (whatever happens), or not now (its health).
#pragma once

#include <string>

#include "gpulock/config.hpp"
#include "gpulock/device.hpp"
#include "gpulock/request.hpp"

namespace gpulock {

// "GPU 3" or "GPU 0:1".
std::string describe_device(const Device& device);

// True if the administrator's config excludes the device (by index, UUID or prefix, or name).
bool excluded_by_config(const Device& device, const Config& config);

// Why the device can never serve the request: "" if it can.
std::string never_reason(const Device& device, const LeaseRequest& request, const Config& config);

// Why the device cannot serve the request now (health filters, foreign processes): "" if it can.
std::string unready_reason(const Device& device, const LeaseRequest& request);

// Whether unready_reason() reads the same values in both for the filters that `in_use` sets
// (any value; allow_foreign_processes false: the check for foreign processes). Then it judges
// alike every request that uses no other filter.
bool same_readiness_inputs(const Device& a, const Device& b, const LeaseRequest& in_use);

}  // namespace gpulock
