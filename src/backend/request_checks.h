// Checks shared by both backends' acquire(): a request's own sanity, its explicit GPU names,
// its deadline, and the administrator's limits.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "gpulock/config.hpp"
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

// When the wait ends: `start` with wait = false, start + timeout, or time_point::max() for no
// timeout (also for a timeout too long for the clock, rather than an overflow).
std::chrono::steady_clock::time_point wait_deadline(const LeaseRequest& request,
                                                    std::chrono::steady_clock::time_point start);

// Throws kUnsatisfiable when `needed` GPUs are more than `user` may hold at once (max_gpus).
void check_gpu_limit(std::size_t needed, const std::string& user, const Config& config);

// Whether a request that must wait, of a user with `waiting_now` requests in the queue, is over
// the user's max_waiting (it then waits outside the queue's order until there is room). Throws
// kUnsatisfiable when the limit is 0: it could never join.
bool waits_over_limit(std::size_t waiting_now, const std::string& user, const Config& config);

// Why a device of this machine is outside the caller's CUDA_VISIBLE_DEVICES, or "".
std::string outside_visible_reason(const Device& device, const LeaseRequest& request);

// The devices of this machine that could ever serve the request: those it names (each must be
// usable: throws kUnsatisfiable naming why one is not), else every device that suits it, with
// why each other one does not in `never_reasons`. `also_never` adds a reason of the caller's
// ("" when the device suits). Does not check that there are enough.
std::vector<const Device*> candidate_devices(
    const std::vector<Device>& devices, const LeaseRequest& request, const Config& config,
    std::vector<std::string>& never_reasons,
    const std::function<std::string(const Device&)>& also_never = {});

}  // namespace gpulock
