// Random identifiers for leases.
#pragma once

#include <string>

namespace gpulock {

// 16 lowercase hex digits (64 bits) from the kernel's random source.
std::string make_lease_id();

// True if text looks like a lease id (what make_lease_id returns).
bool is_lease_id(std::string_view text);

}  // namespace gpulock
