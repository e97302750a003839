// A streaming JSON writer for gpulock's large documents (`status --json` of a whole pool, the
// dashboard's status): it appends to one string as it goes, with no document built in memory,
// in the layout nlohmann's dump(2) gives (two-space indent, "key": value, [] and {} when empty),
// so the output is the same text as before. Keys must be written in ascending byte order, as
// nlohmann's objects sort them (debug builds check); numbers and strings are written as
// nlohmann writes them (ill-formed UTF-8 becomes U+FFFD).
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpulock {

class JsonWriter {
 public:
  explicit JsonWriter(std::string& out) : out_(out) {}

  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }

  // The next member's key, inside an object; its value follows.
  JsonWriter& key(std::string_view name);

  void null();
  void value(bool b);
  void value(double d);  // as nlohmann writes it; NaN and infinities as null
  void value(std::string_view text);
  void value(const char* text) { value(std::string_view(text)); }
  void value(const std::string& text) { value(std::string_view(text)); }
  template <std::integral T>
  requires(!std::same_as<T, bool>) void value(T n) {
    before_value();
    char buffer[24];  // 20 digits and a sign at most
    out_.append(buffer, std::to_chars(buffer, buffer + sizeof buffer, n).ptr);
  }
  template <typename T>
  void value(const std::optional<T>& v) {
    if (v)
      value(*v);
    else
      null();
  }
  template <typename T>
  void value(const std::vector<T>& items) {
    begin_array();
    for (const auto& item : items) value(item);
    end_array();
  }

  // key(name) then value(v).
  template <typename T>
  void member(std::string_view name, const T& v) {
    key(name);
    value(v);
  }
  void null_member(std::string_view name) {
    key(name);
    null();
  }

 private:
  struct Level {
    bool object;
    bool empty = true;
#ifndef NDEBUG
    std::string last_key = {};  // checked in debug builds: keys must ascend
#endif
  };
  void before_value();
  void open(char bracket);
  void close(char bracket);
  void indent(std::size_t depth);
  void write_string(std::string_view text);

  std::string& out_;
  std::vector<Level> levels_;
  bool after_key_ = false;
};

}  // namespace gpulock
