// Parsing and formatting of sizes, durations, percentages, watts and GPU lists.
#include "gpulock/parse.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "util/strings.h"

namespace gpulock {
namespace {

[[noreturn]] void invalid(std::string_view what, std::string_view text, std::string_view hint) {
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("invalid {} '{}': {}", what, sanitize_for_display(text, 64), hint));
}

// Reads a non-negative decimal number ("12", "1.5") from the front of text.
bool take_number(std::string_view& text, double& value) {
  std::size_t end = 0;
  bool seen_digit = false, seen_dot = false;
  while (end < text.size()) {
    const char c = text[end];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else {
      break;
    }
    ++end;
  }
  if (!seen_digit) return false;
  const std::string number(text.substr(0, end));
  char* parsed_end = nullptr;
  value = std::strtod(number.c_str(), &parsed_end);
  if (parsed_end != number.c_str() + number.size() || !std::isfinite(value)) return false;
  text.remove_prefix(end);
  return true;
}

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::uint64_t parse_size(std::string_view input) {
  constexpr std::string_view kHint = "use a number with a unit, e.g. 512M, 20G or 1.5T";
  std::string_view text = trim(input);
  double number = 0;
  if (!take_number(text, number)) invalid("size", input, kHint);
  const std::string unit = lower(trim(text));
  double scale = 0;
  if (unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    invalid("size", input,
            unit.empty() ? "a unit is required (is it bytes or gigabytes?); " + std::string(kHint)
                         : std::string(kHint));
  }
  const double bytes = number * scale;
  if (bytes > 1e18) invalid("size", input, "too large");
  return static_cast<std::uint64_t>(std::llround(bytes));
}

std::chrono::milliseconds parse_duration(std::string_view input) {
  constexpr std::string_view kHint = "use e.g. 90s, 5m, 2h, 1h30m or 250ms";
  std::string_view text = trim(input);
  if (text.empty()) invalid("duration", input, kHint);
  double total_ms = 0;
  bool bare = true;
  while (!text.empty()) {
    double number = 0;
    if (!take_number(text, number)) invalid("duration", input, kHint);
    std::size_t unit_length = 0;
    while (unit_length < text.size() && std::isalpha(static_cast<unsigned char>(text[unit_length])))
      ++unit_length;
    const std::string unit = lower(text.substr(0, unit_length));
    text.remove_prefix(unit_length);
    double scale = 0;
    if (unit.empty()) {
      if (!text.empty() || !bare) invalid("duration", input, kHint);
      scale = 1000;  // a bare number means seconds
    } else if (unit == "ms") {
      scale = 1;
    } else if (unit == "s" || unit == "sec") {
      scale = 1000;
    } else if (unit == "m" || unit == "min") {
      scale = 60'000;
    } else if (unit == "h") {
      scale = 3'600'000;
    } else if (unit == "d") {
      scale = 86'400'000;
    } else {
      invalid("duration", input, kHint);
    }
    bare = false;
    total_ms += number * scale;
  }
  if (total_ms > 1e14) invalid("duration", input, "too long");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(total_ms)));
}

unsigned parse_percent(std::string_view input) {
  std::string_view text = trim(input);
  if (!text.empty() && text.back() == '%') text.remove_suffix(1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value > 100)
    invalid("percentage", input, "use a whole number from 0 to 100, e.g. 10 or 10%");
  return value;
}

double parse_watts(std::string_view input) {
  std::string_view text = trim(input);
  if (!text.empty() && (text.back() == 'W' || text.back() == 'w')) text.remove_suffix(1);
  double value = 0;
  if (!take_number(text, value) || !text.empty() || value <= 0 || value > 1e6)
    invalid("power", input, "use watts, e.g. 150 or 150W");
  return value;
}

std::vector<std::string> parse_gpu_list(std::string_view input) {
  std::vector<std::string> gpus;
  for (const auto& item : split(input, ',')) {
    const std::string_view entry = trim(item);
    if (entry.empty())
      invalid("GPU list", input, "use indices or UUIDs separated by commas, e.g. 0,2 or GPU-8a1c");
    gpus.emplace_back(entry);
  }
  return gpus;
}

std::string format_size(std::uint64_t bytes) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  constexpr double kMiB = 1024.0 * 1024;
  if (bytes >= 1024ULL * 1024 * 1024) return fmt::format("{:.1f} GiB", bytes / kGiB);
  if (bytes >= 1024ULL * 1024 || bytes == 0) return fmt::format("{:.0f} MiB", bytes / kMiB);
  if (bytes >= 1024) return fmt::format("{:.0f} KiB", bytes / 1024.0);
  return fmt::format("{} B", bytes);
}

std::string format_duration(std::chrono::seconds duration) {
  const long long total = std::max<long long>(0, duration.count());
  const long long days = total / 86400, hours = total % 86400 / 3600, minutes = total % 3600 / 60,
                  seconds = total % 60;
  if (days > 0) return fmt::format("{}d {:02}h", days, hours);
  if (hours > 0) return fmt::format("{}h {:02}m", hours, minutes);
  if (minutes > 0) return fmt::format("{}m {:02}s", minutes, seconds);
  return fmt::format("{}s", seconds);
}

}  // namespace gpulock
