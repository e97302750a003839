// CanonicalJsonReader: reads JSON written in one exact form (known keys in a known order, no
// whitespace, strings of printable ASCII without escapes, numbers as a JSON writer prints them)
// without building a document. Files that gpulock reads on every plan (holder records, queue
// tickets) are read with it first; on anything outside that form a step fails, and the caller
// reads the text with the full JSON parser instead, so the two readings must agree on all the
// reader accepts (each caller's tests check that over mutations of what it writes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gpulock {

class CanonicalJsonReader {
 public:
  explicit CanonicalJsonReader(std::string_view text) : rest_(text) {}

  // Consumes `expected` if the text goes on with it.
  bool literal(std::string_view expected);
  // A string of printable ASCII without escapes; its text, without the quotes.
  std::optional<std::string_view> string();
  // A JSON integer without sign, fraction or exponent that fits 64 bits.
  std::optional<std::uint64_t> unsigned_number();
  // A JSON number without sign: digits, then an optional fraction and exponent.
  std::optional<double> number();
  // `true` or `false`.
  std::optional<bool> boolean();
  bool at_end() const { return rest_.empty(); }

  // `key` (with the punctuation before the value, e.g. `,"uid":`), then a value of `out`'s kind
  // (string, unsigned_number, number, boolean) into `out`; false if either is not there.
  bool member(std::string_view key, std::string_view& out) {
    return read(key, out, &CanonicalJsonReader::string);
  }
  bool member(std::string_view key, std::uint64_t& out) {
    return read(key, out, &CanonicalJsonReader::unsigned_number);
  }
  bool member(std::string_view key, double& out) {
    return read(key, out, &CanonicalJsonReader::number);
  }
  bool member(std::string_view key, bool& out) {
    return read(key, out, &CanonicalJsonReader::boolean);
  }
  // An optional member: true when `key` is not there (`out` untouched) or is, with a value.
  template <typename T>
  bool optional_member(std::string_view key, std::optional<T>& out) {
    if (!rest_.starts_with(key)) return true;
    T value{};
    if (!member(key, value)) return false;
    out = value;
    return true;
  }

 private:
  std::size_t count_digits(std::size_t from = 0) const;
  template <typename T>
  bool read(std::string_view key, T& out, std::optional<T> (CanonicalJsonReader::*value)()) {
    if (!literal(key)) return false;
    const std::optional<T> got = (this->*value)();
    if (got) out = *got;
    return got.has_value();
  }
  std::string_view rest_;
};

}  // namespace gpulock
