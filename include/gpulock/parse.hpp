// Parsing of the human-written quantities gpulock accepts: sizes ("20G"), durations ("90s",
// "1h30m"), percentages and GPU lists. Shared by the CLI, the config and the bindings so that
// every entry point accepts exactly the same spellings.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpulock {

// "20G", "512M", "1.5T", "80GiB", "4096K": binary units (K = 1024). A bare number is refused
// (is "20" bytes or gigabytes?). Throws Error(kInvalidArgument) naming the input.
std::uint64_t parse_size(std::string_view text);

// "90s", "5m", "2h", "1h30m", "250ms", "1d"; a bare number means seconds. Negative or
// nonsensical input throws Error(kInvalidArgument).
std::chrono::milliseconds parse_duration(std::string_view text);

// "85", "85%": 0..100.
unsigned parse_percent(std::string_view text);

// "300", "300W", "299.5": watts, > 0.
double parse_watts(std::string_view text);

// "0,2,GPU-8a1c…": split on commas, trimmed; empty items refused.
std::vector<std::string> parse_gpu_list(std::string_view text);

// For display: "80.0 GiB", "512 MiB", "8 KiB" (below 1 MiB), "0 MiB"; "1h 02m", "3m 05s", "12s".
std::string format_size(std::uint64_t bytes);
std::string format_duration(std::chrono::seconds duration);

}  // namespace gpulock
