// Checks shared by both backends' acquire().
#include "backend/request_checks.h"

#include <set>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "backend/visible_devices.h"
#include "util/strings.h"

namespace gpulock {

std::vector<const Device*> resolve_explicit(const std::vector<Device>& devices,
                                            const std::vector<std::string>& names,
                                            const std::string& where) {
  std::vector<const Device*> out;
  std::set<const Device*> seen;
  for (const auto& name : names) {
    std::vector<const Device*> matches;
    for (const auto& d : devices) {
      if (d.display_index() == name || d.uuid == name) {
        matches = {&d};
        break;
      }
      if (name.size() >= 5 && starts_with_ignoring_case(d.uuid, name)) matches.push_back(&d);
    }
    if (matches.empty()) {
      std::string known;
      for (const auto& d : devices) known += (known.empty() ? "" : ", ") + d.display_index();
      throw Error(ErrorCode::kUnsatisfiable,
                  fmt::format("no GPU '{}' on {} (GPUs: {})", sanitize_for_display(name, 96), where,
                              known.empty() ? "none" : known));
    }
    if (matches.size() > 1)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("'{}' matches several GPUs; give more of the UUID",
                              sanitize_for_display(name, 96)));
    if (!seen.insert(matches.front()).second)
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("GPU '{}' is named twice", sanitize_for_display(name, 96)));
    out.push_back(matches.front());
  }
  return out;
}

Error unsatisfiable(const std::string& headline, const std::vector<std::string>& reasons) {
  std::string why = headline;
  if (!reasons.empty()) why += ":";
  for (const auto& reason : reasons) why += "\n  " + reason;
  return Error(ErrorCode::kUnsatisfiable, why);
}

void validate_request(const LeaseRequest& r) {
  if (r.gpus.empty() && r.count == 0)
    throw Error(ErrorCode::kInvalidArgument, "ask for at least one GPU (-n 1 or more)");
  if (r.gpus.empty() && r.count > 4096)
    throw Error(ErrorCode::kUnsatisfiable,
                fmt::format("{} GPUs is more than any machine has", r.count));
  if (r.timeout && r.timeout->count() < 0)
    throw Error(ErrorCode::kInvalidArgument, "the timeout must not be negative");
  if (r.max_utilization_percent && *r.max_utilization_percent > 100)
    throw Error(ErrorCode::kInvalidArgument, "the utilisation limit is a percentage: at most 100");
  // NaN fails both comparisons.
  if (r.max_power_watts && !(*r.max_power_watts >= 0 && *r.max_power_watts <= 1e6))
    throw Error(ErrorCode::kInvalidArgument, "the power limit must be between 0 and 1e6 watts");
}

namespace {

std::string config_name(const Config& config) {
  return config.source.empty() ? "the config" : config.source;
}

}  // namespace

std::chrono::steady_clock::time_point wait_deadline(const LeaseRequest& request,
                                                    std::chrono::steady_clock::time_point start) {
  using Clock = std::chrono::steady_clock;
  if (!request.wait) return start;
  const bool bounded =
      request.timeout && *request.timeout < std::chrono::duration_cast<std::chrono::milliseconds>(
                                                Clock::time_point::max() - start);
  return bounded ? start + *request.timeout : Clock::time_point::max();
}

void check_gpu_limit(std::size_t needed, const std::string& user, const Config& config) {
  const UserLimits limits = config.limits_for(user);
  if (limits.max_gpus && needed > *limits.max_gpus)
    throw Error(ErrorCode::kUnsatisfiable,
                fmt::format("{} GPUs requested, but {} may hold at most {} at once ({})", needed,
                            user, *limits.max_gpus, config_name(config)));
}

bool waits_over_limit(std::size_t waiting_now, const std::string& user, const Config& config) {
  const UserLimits limits = config.limits_for(user);
  const bool over_limit = limits.max_waiting && waiting_now >= *limits.max_waiting;
  if (over_limit && *limits.max_waiting == 0u)
    throw Error(ErrorCode::kUnsatisfiable,
                fmt::format("the GPUs are not free now, and {} may not wait in the queue "
                            "(max_waiting = 0 in {})",
                            user, config_name(config)));
  return over_limit;
}

std::string outside_visible_reason(const Device& device, const LeaseRequest& request) {
  if (!request.cuda_visible_devices || visible_under(device, *request.cuda_visible_devices))
    return "";
  return fmt::format("{} is outside CUDA_VISIBLE_DEVICES={}", describe_device(device),
                     sanitize_for_display(*request.cuda_visible_devices, 128));
}

std::vector<const Device*> candidate_devices(
    const std::vector<Device>& devices, const LeaseRequest& request, const Config& config,
    std::vector<std::string>& never_reasons,
    const std::function<std::string(const Device&)>& also_never) {
  std::vector<const Device*> pool;
  if (!request.gpus.empty()) {
    pool = resolve_explicit(devices, request.gpus);
  } else {
    for (const auto& d : devices) pool.push_back(&d);
  }
  std::vector<const Device*> candidates;
  for (const Device* d : pool) {
    std::string never = never_reason(*d, request, config);
    if (never.empty()) never = outside_visible_reason(*d, request);
    if (never.empty() && also_never) never = also_never(*d);
    if (!never.empty()) {
      // Devices the caller did not name are silently unsuitable; named ones must all be usable.
      if (!request.gpus.empty()) throw Error(ErrorCode::kUnsatisfiable, never);
      never_reasons.push_back(never);
      continue;
    }
    candidates.push_back(d);
  }
  return candidates;
}

}  // namespace gpulock
