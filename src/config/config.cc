// Reading the administrator's config file (include/gpulock/config.hpp) as untrusted input.
//
// The TOML is parsed by toml++; this file then walks the document against the schema that the
// header shows, so that a misspelt key, a wrong type or a value out of range stops with
// "FILE:LINE: what is wrong" instead of being silently ignored. The file is opened so that
// nothing planted at its path (a FIFO, a device, a huge file) can hang or exhaust the reader,
// and every piece of its text that reaches a message goes through sanitize_for_display().
#include "gpulock/config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "gpulock/error.hpp"
#include "gpulock/parse.hpp"
#include "redis/redis_url.h"
#include "util/fd.h"
#include "util/strings.h"

namespace gpulock {
namespace {

constexpr const char* kDefaultConfigPath = "/etc/gpulock/config.toml";
constexpr const char* kConfigPathVariable = "GPULOCK_CONFIG";
constexpr std::size_t kMaxConfigBytes = 1024 * 1024;
constexpr std::int64_t kMaxLimit = 1'000'000;
constexpr std::size_t kMaxShownKey = 64;

[[noreturn]] void config_error(const std::string& message) {
  throw Error(ErrorCode::kConfig, message);
}

// "a string", "an integer", ...: how a TOML value's type reads in a sentence.
const char* type_in_words(toml::node_type type) {
  switch (type) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string quoted_key(std::string_view key) {
  std::string quoted = "'";  // built in steps: g++ 12 -O3 warns (-Wrestrict) on a + b + c here
  quoted += sanitize_for_display(key, kMaxShownKey);
  quoted += '\'';
  return quoted;
}

// A key as it would be written in a table header: bare if it can be, else in double quotes.
std::string header_key(std::string_view key) {
  const bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  const std::string shown = sanitize_for_display(key, kMaxShownKey);
  return bare ? shown : "\"" + shown + "\"";
}

// Where an error about `key` points: the key itself where toml++ recorded it, else its value.
const toml::source_region& location_of(const toml::key& key, const toml::node& node) {
  return key.source().begin.line != 0 ? key.source() : node.source();
}

// Walks one parsed document, turning every departure from the schema into a located error.
class ConfigReader {
 public:
  explicit ConfigReader(const std::string& source_name)
      : shown_source_(sanitize_for_display(source_name)) {}

  Config read(const toml::table& root) const {
    Config config;
    for (auto&& [key, node] : root) {
      if (key == "policy") {
        config.policy = read_policy(node);
      } else if (key == "exclude_gpus") {
        config.excluded_gpus = read_gpu_list(node);
      } else if (key == "limits") {
        read_limits(table_at(node, "'limits'"), config);
      } else if (key == "backend") {
        config.backend = read_text(node, "'backend'");
        if (config.backend != "file") {
          try {
            parse_redis_url(config.backend);
          } catch (const Error& error) {
            fail_at(node.source(),
                    fmt::format("'backend' must be \"file\" or a redis:// URL: {}", error.what()));
          }
        }
      } else if (key == "pool") {
        config.pool = read_text(node, "'pool'");
        const bool valid = config.pool.size() <= 128 &&
                           std::all_of(config.pool.begin(), config.pool.end(), [](char c) {
                             return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                                    c == '_' || c == '.';
                           });
        if (!valid)
          fail_at(node.source(), "'pool' must be 1 to 128 letters, digits, '-', '_' or '.'");
      } else if (key == "lease_ttl") {
        // "30s", "2m", or a number of seconds.
        const auto* seconds = node.as_integer();
        const std::string text = seconds ? std::to_string(seconds->get()) + "s"
                                         : read_text(node, "'lease_ttl' (\"30s\" or seconds)");
        try {
          config.lease_ttl = parse_lease_ttl(text);
        } catch (const Error& error) {
          fail_at(node.source(), fmt::format("'lease_ttl': {}", error.what()));
        }
      } else if (key == "redis_password_file") {
        config.redis_password_file = read_text(node, "'redis_password_file'");
      } else if (key == "idle_after") {
        config.idle_after = read_idle_after(node);
      } else if (key == "serve_show_commands") {
        const auto* flag = node.as_boolean();
        if (flag == nullptr) wrong_type(node, "'serve_show_commands'", "true or false");
        config.serve_show_commands = flag->get();
      } else if (key == "journal_dir") {
        config.journal_dir = read_text(node, "'journal_dir' (a directory, or \"off\")");
      } else if (key == "journal_file_size") {
        const std::string text = read_text(node, "'journal_file_size' (\"64M\")");
        try {
          config.journal_file_size = parse_size(text);
        } catch (const Error& error) {
          fail_at(node.source(), fmt::format("'journal_file_size': {}", error.what()));
        }
        if (config.journal_file_size < 4096)
          fail_at(node.source(), "'journal_file_size': at least 4K");
      } else if (key == "jobs_dir") {
        config.jobs_dir = read_text(node, "'jobs_dir' (a directory)");
        if (config.jobs_dir.empty()) fail_at(node.source(), "'jobs_dir' must name a directory");
      } else if (key == "job_logs_readable") {
        const auto* flag = node.as_boolean();
        if (flag == nullptr) wrong_type(node, "'job_logs_readable'", "true or false");
        config.job_logs_readable = flag->get();
      } else if (key == "job_log_size") {
        const std::string text = read_text(node, "'job_log_size' (\"1G\", or \"off\")");
        if (text == "off") {
          config.job_log_size = 0;
        } else {
          try {
            config.job_log_size = parse_size(text);
          } catch (const Error& error) {
            fail_at(node.source(), fmt::format("'job_log_size': {}", error.what()));
          }
          if (config.job_log_size < 4096) fail_at(node.source(), "'job_log_size': at least 4K");
        }
      } else if (key == "max_jobs_per_gpu") {
        config.max_jobs_per_gpu = read_limit(node, "'max_jobs_per_gpu'", 1);
      } else if (key == "shared_memory_reserve") {
        try {
          config.shared_memory_reserve_bytes =
              parse_size(read_text(node, "'shared_memory_reserve' (\"2G\")"));
        } catch (const Error& error) {
          fail_at(node.source(), fmt::format("'shared_memory_reserve': {}", error.what()));
        }
      } else {
        unknown_key(key, node, "",
                    {"policy", "exclude_gpus", "limits", "backend", "pool", "lease_ttl",
                     "redis_password_file", "idle_after", "serve_show_commands", "journal_dir",
                     "journal_file_size", "max_jobs_per_gpu", "shared_memory_reserve", "jobs_dir",
                     "job_logs_readable", "job_log_size"});
      }
    }
    return config;
  }

 private:
  [[noreturn]] void fail_at(const toml::source_region& where, const std::string& what) const {
    config_error(fmt::format("{}:{}: {}", shown_source_, where.begin.line, what));
  }

  // Refuses `key`, naming the table it is in (`table`, "" for the top level) and the keys
  // that table accepts.
  [[noreturn]] void unknown_key(const toml::key& key, const toml::node& node,
                                std::string_view table,
                                std::initializer_list<std::string_view> known) const {
    std::string known_list;
    for (const auto name : known)
      known_list += (known_list.empty() ? "" : ", ") + std::string(name);
    fail_at(location_of(key, node),
            fmt::format("unknown key {}{} (known: {})", quoted_key(key.str()),
                        table.empty() ? "" : fmt::format(" in [{}]", table), known_list));
  }

  [[noreturn]] void wrong_type(const toml::node& node, const std::string& named,
                               std::string_view expected) const {
    fail_at(node.source(),
            fmt::format("{} must be {}, not {}", named, expected, type_in_words(node.type())));
  }

  const toml::table& table_at(const toml::node& node, const std::string& named) const {
    const auto* table = node.as_table();
    if (table == nullptr) wrong_type(node, named, "a table");
    return *table;
  }

  std::string read_text(const toml::node& node, const std::string& named) const {
    const auto* text = node.as_string();
    if (text == nullptr) wrong_type(node, named, "a string");
    const std::string& value = text->get();
    if (trim(value).empty() || sanitize_for_display(value, 1024) != value)
      fail_at(node.source(), fmt::format("{} must be a non-empty line of text", named));
    return value;
  }

  // "30m", "2h", or a number of seconds: from 1 s to 30 days.
  std::chrono::seconds read_idle_after(const toml::node& node) const {
    const auto* seconds = node.as_integer();
    const std::string text = seconds ? std::to_string(seconds->get()) + "s"
                                     : read_text(node, "'idle_after' (\"30m\" or seconds)");
    std::chrono::milliseconds after{};
    try {
      after = parse_duration(text);
    } catch (const Error& error) {
      fail_at(node.source(), fmt::format("'idle_after': {}", error.what()));
    }
    if (after < std::chrono::seconds(1) || after > std::chrono::hours(24 * 30))
      fail_at(node.source(), "'idle_after' must be from 1s to 30d");
    return std::chrono::duration_cast<std::chrono::seconds>(after);
  }

  QueuePolicy read_policy(const toml::node& node) const {
    const auto* text = node.as_string();
    if (text == nullptr) wrong_type(node, "'policy'", "a string");
    const std::string& value = text->get();
    if (value == queue_policy_name(QueuePolicy::kFairShare)) return QueuePolicy::kFairShare;
    if (value == queue_policy_name(QueuePolicy::kFifo)) return QueuePolicy::kFifo;
    fail_at(node.source(), fmt::format("'policy' must be 'fair-share' or 'fifo', not '{}'",
                                       sanitize_for_display(value, kMaxShownKey)));
  }

  std::vector<std::string> read_gpu_list(const toml::node& node) const {
    const auto* array = node.as_array();
    if (array == nullptr) wrong_type(node, "'exclude_gpus'", "an array of strings");
    std::vector<std::string> gpus;
    for (const toml::node& entry : *array) {
      const auto* text = entry.as_string();
      if (text == nullptr) wrong_type(entry, "'exclude_gpus' entries", "strings");
      const std::string& gpu = text->get();
      if (trim(gpu).empty())
        fail_at(entry.source(),
                "'exclude_gpus' entries must not be empty (use a GPU index, "
                "UUID or UUID prefix, or model name)");
      if (sanitize_for_display(gpu) != gpu)
        fail_at(entry.source(),
                fmt::format("'exclude_gpus' entry '{}' contains control characters or is too long",
                            sanitize_for_display(gpu, kMaxShownKey)));
      gpus.push_back(gpu);
    }
    return gpus;
  }

  // An integer limit from `minimum` to kMaxLimit.
  unsigned read_limit(const toml::node& node, const std::string& named,
                      std::int64_t minimum) const {
    const auto* number = node.as_integer();
    if (number == nullptr) wrong_type(node, named, "an integer");
    const std::int64_t value = number->get();
    if (value < minimum || value > kMaxLimit)
      fail_at(node.source(),
              fmt::format("{} must be from {} to {}, not {}", named, minimum, kMaxLimit, value));
    return static_cast<unsigned>(value);
  }

  void read_limits(const toml::table& limits, Config& config) const {
    for (auto&& [key, node] : limits) {
      if (key == "max_gpus_per_user") {
        config.default_limits.max_gpus = read_limit(node, "'max_gpus_per_user'", 1);
      } else if (key == "max_waiting_per_user") {
        config.default_limits.max_waiting = read_limit(node, "'max_waiting_per_user'", 0);
      } else if (key == "users") {
        read_users(table_at(node, "'users' in [limits]"), config);
      } else {
        unknown_key(key, node, "limits", {"max_gpus_per_user", "max_waiting_per_user", "users"});
      }
    }
  }

  void read_users(const toml::table& users, Config& config) const {
    for (auto&& [key, node] : users) {
      const std::string user(key.str());
      const auto& where = location_of(key, node);
      if (user.empty()) fail_at(where, "a user name in [limits.users] is empty");
      if (sanitize_for_display(user) != user)
        fail_at(where, fmt::format("user name {} in [limits.users] contains control characters "
                                   "or is too long",
                                   quoted_key(user)));
      config.per_user[user] = read_user_limits(
          table_at(node, fmt::format("{} in [limits.users]", quoted_key(user))), user);
    }
  }

  UserLimits read_user_limits(const toml::table& table, const std::string& user) const {
    const std::string section = "limits.users." + header_key(user);
    UserLimits limits;
    for (auto&& [key, node] : table) {
      if (key == "max_gpus") {
        limits.max_gpus = read_limit(node, fmt::format("'max_gpus' in [{}]", section), 1);
      } else if (key == "max_waiting") {
        limits.max_waiting = read_limit(node, fmt::format("'max_waiting' in [{}]", section), 0);
      } else {
        unknown_key(key, node, section, {"max_gpus", "max_waiting"});
      }
    }
    return limits;
  }

  std::string shown_source_;
};

// Reads the whole of an open regular file, refusing one over kMaxConfigBytes (even one that
// grows while it is read).
std::string read_bounded(int fd, const std::string& shown_path) {
  std::string text;
  char buffer[64 * 1024];
  while (true) {
    const ssize_t got = ::read(fd, buffer, sizeof buffer);
    if (got < 0) {
      if (errno == EINTR) continue;
      config_error(errno_message("cannot read " + shown_path, errno));
    }
    if (got == 0) return text;
    text.append(buffer, static_cast<std::size_t>(got));
    if (text.size() > kMaxConfigBytes)
      config_error(fmt::format("config file {} is larger than 1 MiB", shown_path));
  }
}

}  // namespace

UserLimits Config::limits_for(const std::string& user) const {
  UserLimits limits = default_limits;
  const auto own = per_user.find(user);
  if (own == per_user.end()) return limits;
  if (own->second.max_gpus) limits.max_gpus = own->second.max_gpus;
  if (own->second.max_waiting) limits.max_waiting = own->second.max_waiting;
  return limits;
}

Config parse_config(std::string_view text, const std::string& source_name) {
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(source_name));
  } catch (const toml::parse_error& error) {
    config_error(fmt::format("{}:{}:{}: {}", sanitize_for_display(source_name),
                             error.source().begin.line, error.source().begin.column,
                             sanitize_for_display(error.description())));
  }
  return ConfigReader(source_name).read(root);
}

std::chrono::milliseconds parse_lease_ttl(std::string_view text) {
  const auto ttl = parse_duration(text);
  if (ttl < std::chrono::milliseconds(500) || ttl > std::chrono::hours(24))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("a lease TTL must be from 500ms to 1d, not '{}'",
                            sanitize_for_display(text, 64)));
  return ttl;
}

std::string config_path() {
  const char* named = std::getenv(kConfigPathVariable);
  return named != nullptr && *named != '\0' ? named : kDefaultConfigPath;
}

Config load_config() {
  const char* named = std::getenv(kConfigPathVariable);
  const bool named_by_environment = named != nullptr && *named != '\0';
  const std::string path = config_path();
  const std::string shown_path = sanitize_for_display(path);

  // O_NONBLOCK: opening a FIFO planted at the path must not wait for a writer. Symlinks are
  // followed (administrators link config files into place); a loop fails with ELOOP.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd) {
    const int error = errno;
    if (error == ENOENT && !named_by_environment) return Config{};
    if (error == ENOENT)
      config_error(fmt::format("config file {} (named by {}) does not exist", shown_path,
                               kConfigPathVariable));
    if (error == ELOOP)
      config_error(fmt::format("cannot read {}: symlink loop (too many levels of symbolic links)",
                               shown_path));
    config_error(errno_message("cannot read " + shown_path, error));
  }
  struct stat status {};
  if (::fstat(fd.get(), &status) != 0)
    config_error(errno_message("cannot read " + shown_path, errno));
  if (S_ISDIR(status.st_mode))
    config_error(fmt::format("config file {} is a directory", shown_path));
  if (!S_ISREG(status.st_mode))
    config_error(fmt::format("config file {} is not a regular file", shown_path));
  if (static_cast<std::uint64_t>(status.st_size) > kMaxConfigBytes)
    config_error(fmt::format("config file {} is larger than 1 MiB ({} bytes)", shown_path,
                             static_cast<std::uint64_t>(status.st_size)));

  Config config = parse_config(read_bounded(fd.get(), shown_path), path);
  config.source = path;
  return config;
}

}  // namespace gpulock
