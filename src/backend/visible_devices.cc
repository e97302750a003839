// Parsing and formatting CUDA_VISIBLE_DEVICES.
#include "backend/visible_devices.h"

#include <algorithm>
#include <cctype>

#include "util/strings.h"

namespace gpulock {
namespace {

bool all_digits(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) != 0;
  });
}

bool entry_matches(std::string_view entry, const Device& device) {
  if (all_digits(entry)) {
    // An index names a whole GPU; MIG instances of that GPU come with it.
    return entry.size() < 6 && std::stoul(std::string(entry)) == device.index;
  }
  if (device.uuid.starts_with(entry)) return true;
  return !device.parent_uuid.empty() && entry.starts_with("GPU-") &&
         device.parent_uuid.starts_with(entry);
}

}  // namespace

bool visible_under(const Device& device, const std::string& cuda_visible_devices) {
  for (const auto& item : split(cuda_visible_devices, ',')) {
    const std::string_view entry = trim(item);
    const bool valid =
        all_digits(entry) ||
        ((entry.starts_with("GPU-") || entry.starts_with("MIG-")) && entry.size() > 4);
    if (!valid) return false;  // CUDA stops at the first entry it cannot parse
    if (entry_matches(entry, device)) return true;
  }
  return false;
}

std::string format_visible_devices(const std::vector<LeasedGpu>& gpus, VisibleFormat format) {
  std::string out;
  for (const auto& gpu : gpus) {
    if (!out.empty()) out += ',';
    if (format == VisibleFormat::kUuid || gpu.is_mig_instance) {
      out += gpu.uuid;
    } else {
      out += std::to_string(gpu.index);
    }
  }
  return out;
}

}  // namespace gpulock
