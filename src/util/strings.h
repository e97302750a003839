// Small string helpers: trimming, splitting, making untrusted text safe to print, shell quoting.
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpulock {

std::string_view trim(std::string_view text);
std::vector<std::string> split(std::string_view text, char separator);
bool starts_with_ignoring_case(std::string_view text, std::string_view prefix);

// The number that the whole of `text` is (std::from_chars: no sign for unsigned types, no spaces,
// nothing after it); nullopt for anything else, an empty text, or one out of T's range.
template <typename T>
std::optional<T> whole_number(std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Makes untrusted text safe to show: control characters (C0, DEL and C1, so terminal escapes
// included) and invalid UTF-8 become '?', and the text is cut on a character boundary (ending
// in "…") so that the result is valid UTF-8 of at most max_length bytes.
std::string sanitize_for_display(std::string_view text, std::size_t max_length = 256);

// Whether the text is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF).
bool is_valid_utf8(std::string_view text);

// Quotes a value for a POSIX shell (single quotes; embedded quotes escaped).
std::string shell_quote(std::string_view value);

// The command line as one string, each word shell-quoted only when it needs it.
std::string join_command_line(const std::vector<std::string>& argv);

}  // namespace gpulock
