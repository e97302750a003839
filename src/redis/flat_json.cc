// A DOM-free reader of flat JSON objects (flat_json.h says what it accepts and declines).
#include "redis/flat_json.h"

#include <charconv>
#include <cmath>

namespace gpulock {
namespace {

// One pass over the text; every method returns false to decline.
class Reader {
 public:
  explicit Reader(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  bool document(FlatJsonObject& out) {
    skip_space();
    if (!object(out, /*nested=*/false)) return false;
    skip_space();
    return p_ == end_;
  }

 private:
  void skip_space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  bool take(char c) {
    skip_space();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }

  bool object(FlatJsonObject& out, bool nested) {
    if (!take('{')) return false;
    // Room for the fields of a registration (7 to 9): one allocation each, not one per doubling.
    out.keys.reserve(12);
    out.values.reserve(12);
    skip_space();
    if (p_ != end_ && *p_ == '}') {
      ++p_;
      return true;
    }
    for (;;) {
      std::string_view key;
      skip_space();
      if (!string(key) || !take(':')) return false;
      FlatJsonValue value;
      if (!this->value(value, nested)) return false;
      out.keys.push_back(key);
      out.values.push_back(std::move(value));
      skip_space();
      if (p_ == end_) return false;
      if (*p_ == '}') {
        ++p_;
        return true;
      }
      if (*p_ != ',') return false;
      ++p_;
    }
  }

  // Printable ASCII without escapes only: anything else is left to the full parser (which
  // checks UTF-8 and decodes escapes).
  bool string(std::string_view& out) {
    if (p_ == end_ || *p_ != '"') return false;
    const char* start = ++p_;
    while (p_ != end_ && *p_ != '"') {
      const auto c = static_cast<unsigned char>(*p_);
      if (c < 0x20 || c >= 0x7f || c == '\\') return false;
      ++p_;
    }
    if (p_ == end_) return false;
    out = std::string_view(start, static_cast<std::size_t>(p_ - start));
    ++p_;
    return true;
  }

  bool literal(std::string_view word) {
    if (static_cast<std::size_t>(end_ - p_) < word.size() ||
        std::string_view(p_, word.size()) != word)
      return false;
    p_ += word.size();
    return true;
  }

  // JSON's number grammar without a sign: 0 | [1-9][0-9]*, then an optional fraction and
  // exponent. An integer is unsigned if it fits 64 bits (else declined: a full parser makes it
  // a real); anything with a fraction or exponent is a real, read as strtod reads it.
  bool number(FlatJsonValue& out) {
    const char* start = p_;
    const auto digits = [&] {
      const char* from = p_;
      while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      return p_ - from;
    };
    const auto integer_digits = digits();
    if (integer_digits == 0 || (integer_digits > 1 && *start == '0')) return false;
    bool real = false;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (digits() == 0) return false;
      real = true;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (digits() == 0) return false;
      real = true;
    }
    if (!real) {
      const auto [end, error] = std::from_chars(start, p_, out.unsigned_number);
      if (error != std::errc() || end != p_) return false;
      out.kind = FlatJsonValue::Kind::kUnsigned;
      out.real = static_cast<double>(out.unsigned_number);
      return true;
    }
    const auto [end, error] = std::from_chars(start, p_, out.real);
    if (error != std::errc() || end != p_ || !std::isfinite(out.real)) return false;
    out.kind = FlatJsonValue::Kind::kReal;
    return true;
  }

  bool value(FlatJsonValue& out, bool nested) {
    skip_space();
    if (p_ == end_) return false;
    switch (*p_) {
      case '"':
        out.kind = FlatJsonValue::Kind::kString;
        return string(out.text);
      case 't':
        out.kind = FlatJsonValue::Kind::kBool;
        out.boolean = true;
        return literal("true");
      case 'f':
        out.kind = FlatJsonValue::Kind::kBool;
        return literal("false");
      case 'n':
        return literal("null");
      case '[':
        // Arrays of objects, one level deep: the readings' processes.
        if (nested) return false;
        ++p_;
        out.kind = FlatJsonValue::Kind::kArray;
        skip_space();
        if (p_ != end_ && *p_ == ']') {
          ++p_;
          return true;
        }
        for (;;) {
          if (!object(out.objects.emplace_back(), /*nested=*/true)) return false;
          skip_space();
          if (p_ == end_) return false;
          if (*p_ == ']') {
            ++p_;
            return true;
          }
          if (*p_ != ',') return false;
          ++p_;
        }
      default:
        return number(out);
    }
  }

  const char* p_;
  const char* end_;
};

}  // namespace

const FlatJsonValue* FlatJsonObject::find(std::string_view key) const {
  for (std::size_t i = keys.size(); i-- > 0;)
    if (keys[i] == key) return &values[i];
  return nullptr;
}

std::optional<FlatJsonObject> parse_flat_json(std::string_view json) {
  FlatJsonObject out;
  if (!Reader(json).document(out)) return std::nullopt;
  return out;
}

}  // namespace gpulock
