// Parsing redis:// URLs.
#include "redis/redis_url.h"

#include <cctype>
#include <charconv>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "util/strings.h"

namespace gpulock {
namespace {

constexpr std::string_view kScheme = "redis://";

[[noreturn]] void bad(const std::string& what) {
  throw Error(
      ErrorCode::kInvalidArgument,
      fmt::format("invalid Redis URL: {} (expected redis://[user:password@]host:port/db)", what));
}

int parse_number(std::string_view text, int low, int high, const char* what) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < low ||
      value > high)
    // Not echoed: a URL missing "@host" puts the password here.
    bad(fmt::format("{} is not a number from {} to {}", what, low, high));
  return value;
}

// %XX escapes, for passwords with reserved characters.
std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    int value = 0;
    if (i + 2 >= text.size()) bad("a truncated %-escape");
    const auto [end, error] = std::from_chars(text.data() + i + 1, text.data() + i + 3, value, 16);
    if (error != std::errc() || end != text.data() + i + 3) bad("a malformed %-escape");
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

}  // namespace

bool is_redis_url(std::string_view text) {
  return starts_with_ignoring_case(text, kScheme);
}

std::string RedisEndpoint::display() const {
  std::string login;
  if (!user.empty() || !password.empty())
    login = fmt::format("{}{}@", sanitize_for_display(user, 64), password.empty() ? "" : ":***");
  const bool ipv6 = host.find(':') != std::string::npos;
  return fmt::format("redis://{}{}{}{}:{}/{}", login, ipv6 ? "[" : "", host, ipv6 ? "]" : "", port,
                     db);
}

RedisEndpoint parse_redis_url(std::string_view url) {
  if (!is_redis_url(url)) {
    if (starts_with_ignoring_case(url, "rediss://")) bad("TLS (rediss://) is not supported");
    bad("it must start with redis://");
  }
  std::string_view rest = url.substr(kScheme.size());
  RedisEndpoint endpoint;
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view login = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = login.find(':');
    endpoint.user = percent_decode(login.substr(0, colon));
    if (colon != std::string_view::npos)
      endpoint.password = percent_decode(login.substr(colon + 1));
    // redis://user@host names a user whose password comes from GPULOCK_REDIS_PASSWORD or the
    // config's redis_password_file; redis://:password@host is the default user's password.
  }
  std::string_view authority = rest.substr(0, rest.find('/'));
  std::string_view path =
      rest.size() > authority.size() ? rest.substr(authority.size() + 1) : std::string_view{};
  if (const auto query = path.find('?'); query != std::string_view::npos)
    bad("query parameters are not supported");
  std::string_view port_text;
  if (authority.starts_with('[')) {
    const auto close = authority.find(']');
    if (close == std::string_view::npos) bad("an unclosed '[' in the host");
    endpoint.host = std::string(authority.substr(1, close - 1));
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (!after.starts_with(':')) bad("text after the host");
      port_text = after.substr(1);
    }
  } else {
    const auto colon = authority.find(':');
    endpoint.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (endpoint.host.empty()) bad("no host");
  for (const char c : endpoint.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' ||
          c == ':'))
      bad(fmt::format("the host '{}' has characters a host name cannot have",
                      sanitize_for_display(endpoint.host, 64)));
  if (!port_text.empty()) endpoint.port = parse_number(port_text, 1, 65535, "the port");
  if (!path.empty()) endpoint.db = parse_number(path, 0, 1 << 20, "the database number");
  return endpoint;
}

}  // namespace gpulock
