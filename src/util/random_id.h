// Random identifiers for leases.
#pragma once

#include <string>

#include "gpulock/lease.hpp"

namespace gpulock {

// 16 lowercase hex digits (64 bits) from the kernel's random source.
std::string make_lease_id();

// is_lease_id(), which tells such an id, is public: gpulock/lease.hpp.

}  // namespace gpulock
