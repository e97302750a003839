// CanonicalJsonReader: the steps of reading JSON in one exact form.
#include "util/canonical_json_reader.h"

#include <charconv>
#include <system_error>

namespace gpulock {

bool CanonicalJsonReader::literal(std::string_view expected) {
  if (!rest_.starts_with(expected)) return false;
  rest_.remove_prefix(expected.size());
  return true;
}

std::optional<std::string_view> CanonicalJsonReader::string() {
  if (!literal("\"")) return std::nullopt;
  for (std::size_t i = 0; i < rest_.size(); ++i) {
    const auto c = static_cast<unsigned char>(rest_[i]);
    if (c == '"') {
      const std::string_view text = rest_.substr(0, i);
      rest_.remove_prefix(i + 1);
      return text;
    }
    if (c < 0x20 || c >= 0x7f || c == '\\') return std::nullopt;  // the full parser's case
  }
  return std::nullopt;
}

std::optional<std::uint64_t> CanonicalJsonReader::unsigned_number() {
  const std::size_t digits = count_digits();
  if (digits == 0 || (digits > 1 && rest_[0] == '0') || digits > 20) return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(rest_.data(), rest_.data() + digits, value);
  if (error != std::errc() || end != rest_.data() + digits) return std::nullopt;
  rest_.remove_prefix(digits);
  if (!rest_.empty() && (rest_[0] == '.' || rest_[0] == 'e' || rest_[0] == 'E'))
    return std::nullopt;
  return value;
}

std::optional<double> CanonicalJsonReader::number() {
  std::size_t n = count_digits();
  if (n == 0 || (n > 1 && rest_[0] == '0')) return std::nullopt;
  if (n < rest_.size() && rest_[n] == '.') {
    const std::size_t fraction = count_digits(n + 1);
    if (fraction == 0) return std::nullopt;
    n += 1 + fraction;
  }
  if (n < rest_.size() && (rest_[n] == 'e' || rest_[n] == 'E')) {
    std::size_t at = n + 1;
    if (at < rest_.size() && (rest_[at] == '+' || rest_[at] == '-')) ++at;
    const std::size_t exponent = count_digits(at);
    if (exponent == 0) return std::nullopt;
    n = at + exponent;
  }
  double value = 0;
  const auto [end, error] = std::from_chars(rest_.data(), rest_.data() + n, value);
  if (error != std::errc() || end != rest_.data() + n) return std::nullopt;
  rest_.remove_prefix(n);
  return value;
}

std::optional<bool> CanonicalJsonReader::boolean() {
  if (literal("true")) return true;
  if (literal("false")) return false;
  return std::nullopt;
}

std::size_t CanonicalJsonReader::count_digits(std::size_t from) const {
  std::size_t n = from;
  while (n < rest_.size() && rest_[n] >= '0' && rest_[n] <= '9') ++n;
  return n - from;
}

}  // namespace gpulock
