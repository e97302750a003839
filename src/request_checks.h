// Checks shared by both backends' acquire(): a request's own sanity, its explicit GPU names.
#pragma once

#include <string>
#include <vector>

#include "gpulock/device.hpp"
#include "gpulock/error.hpp"
#include "gpulock/request.hpp"

namespace gpulock {

// Throws kInvalidArgument / kUnsatisfiable for a request that is malformed in itself.
void validate_request(const LeaseRequest& request);

// Resolves explicit GPU names (index "0", "0:1", UUID or a unique prefix of 5+ characters) to
// devices. Throws for unknown, ambiguous or repeated names. `where` names the place searched
// in messages ("this machine", "host b").
std::vector<const Device*> resolve_explicit(const std::vector<Device>& devices,
                                            const std::vector<std::string>& names,
                                            const std::string& where = "this machine");

// kUnsatisfiable: the headline, then one indented line per reason.
Error unsatisfiable(const std::string& headline, const std::vector<std::string>& reasons);

}  // namespace gpulock
