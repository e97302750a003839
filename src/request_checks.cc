// Checks shared by both backends' acquire().
#include "request_checks.h"

#include <set>

#include <fmt/format.h>

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

}  // namespace gpulock
