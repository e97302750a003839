// JsonWriter: layout, numbers and string escaping (see json_writer.h).
#include "util/json_writer.h"

#include <cassert>

#include <nlohmann/json.hpp>

namespace gpulock {

JsonWriter& JsonWriter::key(std::string_view name) {
  assert(!levels_.empty() && levels_.back().object && !after_key_);
#ifndef NDEBUG
  // Members in ascending key order, as nlohmann's sorted objects list them.
  assert(levels_.back().empty || levels_.back().last_key < name);
  levels_.back().last_key = name;
#endif
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
  assert(!levels_.empty() && levels_.back().object == (bracket == '}') && !after_key_);
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

// Doubles go through nlohmann's own formatting (Grisu2, then its layout: ".0" on whole
// numbers, an exponent past 15 digits), so that the digits are those nlohmann always wrote; its
// shortest-looking digits differ from std::to_chars's in the last place for about one value in
// a thousand.
void JsonWriter::value(double d) {
  before_value();
  if (!std::isfinite(d)) {
    out_ += "null";
    return;
  }
  char buffer[64];
  const char* end = nlohmann::detail::to_chars(buffer, buffer + sizeof buffer, d);
  out_.append(buffer, static_cast<std::size_t>(end - buffer));
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
