// Small string helpers.
#include "util/strings.h"

#include <algorithm>
#include <cctype>

namespace gpulock {

std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = text.find(separator, start);
    parts.emplace_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  return std::equal(prefix.begin(), prefix.end(), text.begin(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) ==
           std::tolower(static_cast<unsigned char>(b));
  });
}

namespace {

// Length of the UTF-8 sequence starting at text[i], or 0 if it is not a valid one
// (overlong forms, surrogates and values above U+10FFFF included).
std::size_t utf8_sequence_length(std::string_view text, std::size_t i, char32_t& code) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  std::size_t length = 0;
  if (lead < 0x80) {
    code = lead;
    return 1;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code = lead & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kSmallest[length] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return length;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    char32_t code = 0;
    const std::size_t length = utf8_sequence_length(text, i, code);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

std::string sanitize_for_display(std::string_view text, std::size_t max_length) {
  constexpr std::string_view kEllipsis = "\u2026";  // …
  // The common case, short printable ASCII, as it is.
  if (text.size() <= max_length &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c < 0x7F; }))
    return std::string(text);
  // The text made safe; `keep` is where it would be cut (the end of the last character that
  // leaves room for the ellipsis).
  std::string safe;
  std::size_t keep = 0;
  safe.reserve(std::min(text.size(), max_length + kEllipsis.size()));
  for (std::size_t i = 0; i < text.size();) {
    char32_t code = 0;
    std::size_t length = utf8_sequence_length(text, i, code);
    std::string_view piece = text.substr(i, length);
    // C0 and C1 controls (terminal escapes: ESC, CSI U+009B, OSC U+009D) and invalid bytes.
    if (length == 0 || code < 0x20 || (code >= 0x7F && code <= 0x9F)) {
      piece = "?";
      length = std::max<std::size_t>(length, 1);
    }
    safe += piece;
    if (safe.size() + kEllipsis.size() <= max_length) keep = safe.size();
    i += length;
    if (safe.size() > max_length + kEllipsis.size()) break;  // enough to know it must be cut
  }
  if (safe.size() <= max_length) return safe;
  // Cut on a character boundary, leaving room for the ellipsis.
  safe.resize(keep);
  if (keep + kEllipsis.size() <= max_length) safe += kEllipsis;
  return safe;
}

std::string shell_quote(std::string_view value) {
  const bool plain = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("-_.,:/=@%+").find(c) != std::string_view::npos;
  });
  if (plain) return std::string(value);
  std::string out = "'";
  for (char c : value) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string join_command_line(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& word : argv) {
    if (!out.empty()) out += ' ';
    out += shell_quote(word);
  }
  return out;
}

}  // namespace gpulock
