// How a host publishes its GPUs in Redis: a static part (identity, model, memory, modes), which
// changes only when the hardware does, and readings (memory in use, utilisation, power,
// processes) that other hosts use for health filters on GPUs they cannot query themselves.
//
// Anyone who may write the pool's keys can write these, so parse_registered_device() validates
// every field and bounds every string and list, and returns nullopt for anything malformed.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gpulock/device.hpp"

namespace gpulock {

std::string device_static_json(const Device& device);
std::string device_readings_json(const Device& device);

// The device from its two parts; readings that are missing or malformed are left unset (a
// health filter then fails, as for a device that cannot report them).
std::optional<Device> parse_registered_device(std::string_view static_json,
                                              std::string_view readings_json);

}  // namespace gpulock
