// JsonWriter: layout, numbers and string escaping (see json_writer.h).
#include "util/json_writer.h"

#include <charconv>
#include <cstdlib>

namespace gpulock {

JsonWriter& JsonWriter::key(std::string_view name) {
  before_value();
  write_string(name);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (levels_.empty()) return;
  Level& level = levels_.back();
  out_ += level.empty ? "\n" : ",\n";
  level.empty = false;
  indent(levels_.size());
}

void JsonWriter::open(char bracket) {
  before_value();
  out_ += bracket;
  levels_.push_back(Level{bracket == '{'});
}

void JsonWriter::close(char bracket) {
  const bool empty = levels_.back().empty;
  levels_.pop_back();
  if (!empty) {
    out_ += '\n';
    indent(levels_.size());
  }
  out_ += bracket;
}

void JsonWriter::indent(std::size_t depth) {
  out_.append(depth * 2, ' ');
}

void JsonWriter::null() {
  before_value();
  out_ += "null";
}

void JsonWriter::value(bool b) {
  before_value();
  out_ += b ? "true" : "false";
}

void JsonWriter::signed_number(long long n) {
  before_value();
  char buffer[24];
  out_.append(buffer, std::to_chars(buffer, buffer + sizeof buffer, n).ptr);
}

void JsonWriter::unsigned_number(unsigned long long n) {
  before_value();
  char buffer[24];
  out_.append(buffer, std::to_chars(buffer, buffer + sizeof buffer, n).ptr);
}

// The shortest digits that read back as `d`, laid out as nlohmann lays them out: plain decimals
// while the decimal point falls within 15 digits of the first (with ".0" on a whole number),
// else d.ddde+XX.
void JsonWriter::value(double d) {
  before_value();
  if (!std::isfinite(d)) {
    out_ += "null";
    return;
  }
  if (d == 0) {
    out_ += std::signbit(d) ? "-0.0" : "0.0";
    return;
  }
  char buffer[40];
  const char* end =
      std::to_chars(buffer, buffer + sizeof buffer, d, std::chars_format::scientific).ptr;
  std::string_view text(buffer, static_cast<std::size_t>(end - buffer));
  if (text.front() == '-') {
    out_ += '-';
    text.remove_prefix(1);
  }
  const std::size_t e_at = text.find('e');
  std::string digits;
  for (const char c : text.substr(0, e_at))
    if (c != '.') digits += c;
  const int exponent = std::atoi(std::string(text.substr(e_at + 1)).c_str());
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;  // where the decimal point falls, counted from the first digit
  constexpr int kMinExp = -4, kMaxExp = 15;
  if (k <= n && n <= kMaxExp) {
    out_ += digits;
    out_.append(static_cast<std::size_t>(n - k), '0');
    out_ += ".0";
  } else if (0 < n && n <= kMaxExp) {
    out_.append(digits, 0, static_cast<std::size_t>(n));
    out_ += '.';
    out_.append(digits, static_cast<std::size_t>(n));
  } else if (kMinExp < n && n <= 0) {
    out_ += "0.";
    out_.append(static_cast<std::size_t>(-n), '0');
    out_ += digits;
  } else {
    out_ += digits[0];
    if (k > 1) {
      out_ += '.';
      out_.append(digits, 1);
    }
    const int e = n - 1;
    out_ += e < 0 ? "e-" : "e+";
    const int magnitude = std::abs(e);
    if (magnitude < 10) out_ += '0';
    out_ += std::to_string(magnitude);
  }
}

void JsonWriter::value(std::string_view text) {
  before_value();
  write_string(text);
}

// Escapes as JSON requires (`"`, `\`, control characters, the common ones by name and the rest
// as \u00xx); other bytes pass through when they are well-formed UTF-8, and each ill-formed
// sequence becomes U+FFFD.
void JsonWriter::write_string(std::string_view text) {
  out_ += '"';
  static constexpr char kHex[] = "0123456789abcdef";
  std::size_t i = 0;
  while (i < text.size()) {
    // A run of characters that stand for themselves, appended at once.
    std::size_t plain = i;
    while (plain < text.size()) {
      const auto p = static_cast<unsigned char>(text[plain]);
      if (p < 0x20 || p >= 0x80 || p == '"' || p == '\\') break;
      ++plain;
    }
    if (plain > i) {
      out_.append(text.substr(i, plain - i));
      i = plain;
      continue;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\b':
          out_ += "\\b";
          break;
        case '\f':
          out_ += "\\f";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\r':
          out_ += "\\r";
          break;
        case '\t':
          out_ += "\\t";
          break;
        default:
          if (c < 0x20) {
            out_ += "\\u00";
            out_ += kHex[c >> 4];
            out_ += kHex[c & 15];
          } else {
            out_ += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A multi-byte sequence: its length by the lead byte, and the range its second byte must
    // fall in (which rules out overlong forms, surrogates and code points past U+10FFFF).
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    }
    std::size_t good = length == 0 ? 0 : 1;
    while (good > 0 && good < length && i + good < text.size()) {
      const auto next = static_cast<unsigned char>(text[i + good]);
      if (next < (good == 1 ? low : 0x80) || next > (good == 1 ? high : 0xBF)) break;
      ++good;
    }
    if (good == length && length > 0) {
      out_.append(text.substr(i, length));
      i += length;
    } else {
      out_ += "\xEF\xBF\xBD";
      i += good == 0 ? 1 : good;
    }
  }
  out_ += '"';
}

}  // namespace gpulock
