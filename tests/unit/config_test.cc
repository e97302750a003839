// The administrator's config file (include/gpulock/config.hpp): every accepted key, per-user
// overrides, and every refusal being Error(kConfig) with "FILE:LINE: ..." that names the key;
// and load_config() refusing what is not a readable regular file of at most 1 MiB, without
// hanging on a FIFO.
#include "gpulock/config.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/error.hpp"
#include "temp_dir.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using test_support::TempDir;

constexpr const char* kSource = "test.toml";

// Parses text expecting Error(kConfig); returns its message ("" after a failure is recorded).
std::string ConfigError(const std::string& text, const std::string& source = kSource) {
  try {
    parse_config(text, source);
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kConfig) << error.what();
    return error.what();
  }
  return "";
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool StartsWith(const std::string& text, const std::string& prefix) {
  return text.rfind(prefix, 0) == 0;
}

// --- parse_config: what is accepted --------------------------------------------------------

TEST(ConfigParseTest, EmptyTextGivesDefaults) {
  for (const char* text : {"", "\n", "# nothing set yet\n\n   \n"}) {
    const Config config = parse_config(text, kSource);
    EXPECT_EQ(config.policy, QueuePolicy::kFairShare) << text;
    EXPECT_FALSE(config.default_limits.max_gpus);
    EXPECT_FALSE(config.default_limits.max_waiting);
    EXPECT_TRUE(config.per_user.empty());
    EXPECT_TRUE(config.excluded_gpus.empty());
    EXPECT_EQ(config.source, "");  // parse_config names no file; load_config sets it
  }
}

TEST(ConfigParseTest, ReadsTheUsageJournalsKeys) {
  const Config config =
      parse_config("journal_dir = \"/srv/journal\"\njournal_file_size = \"1M\"\n", kSource);
  EXPECT_EQ(config.journal_dir, "/srv/journal");
  EXPECT_EQ(config.journal_file_size, 1u << 20);
  EXPECT_EQ(parse_config("", kSource).journal_file_size, 64u << 20);
  EXPECT_TRUE(Contains(ConfigError("journal_file_size = \"1K\"\n"), "at least 4K"));
  EXPECT_TRUE(Contains(ConfigError("journal_file_size = \"lots\"\n"), "journal_file_size"));
  EXPECT_TRUE(Contains(ConfigError("journal_dir = 5\n"), "journal_dir"));
}

TEST(ConfigParseTest, ReadsTheJobsKeys) {
  const Config defaults = parse_config("", kSource);
  EXPECT_EQ(defaults.jobs_dir, "");
  EXPECT_FALSE(defaults.job_logs_readable);
  EXPECT_EQ(defaults.job_log_size, 1u << 30);
  const Config config = parse_config(
      "jobs_dir = \"/srv/jobs\"\njob_logs_readable = true\njob_log_size = \"64M\"\n", kSource);
  EXPECT_EQ(config.jobs_dir, "/srv/jobs");
  EXPECT_TRUE(config.job_logs_readable);
  EXPECT_EQ(config.job_log_size, 64u << 20);
  EXPECT_EQ(parse_config("job_log_size = \"off\"\n", kSource).job_log_size, 0u);
  EXPECT_TRUE(Contains(ConfigError("job_log_size = \"1K\"\n"), "at least 4K"));
  EXPECT_TRUE(Contains(ConfigError("job_log_size = \"lots\"\n"), "job_log_size"));
  EXPECT_TRUE(Contains(ConfigError("job_logs_readable = \"yes\"\n"), "true or false"));
  EXPECT_TRUE(Contains(ConfigError("jobs_dir = \"\"\n"), "jobs_dir"));
}

TEST(ConfigParseTest, DefaultConfigHasNoLimits) {
  const Config config;
  const UserLimits limits = config.limits_for("alice");
  EXPECT_FALSE(limits.max_gpus);
  EXPECT_FALSE(limits.max_waiting);
  EXPECT_EQ(config.policy, QueuePolicy::kFairShare);
}

TEST(ConfigParseTest, ReadsEveryKey) {
  const Config config = parse_config(R"(
policy = "fifo"
exclude_gpus = ["7", "GPU-1a2b3c4d", "NVIDIA T400"]

[limits]
max_gpus_per_user = 4
max_waiting_per_user = 100

[limits.users.alice]
max_gpus = 8
max_waiting = 200

[limits.users."bob.smith"]
max_waiting = 0
)",
                                     kSource);
  EXPECT_EQ(config.policy, QueuePolicy::kFifo);
  EXPECT_EQ(config.excluded_gpus, (std::vector<std::string>{"7", "GPU-1a2b3c4d", "NVIDIA T400"}));
  EXPECT_EQ(config.default_limits.max_gpus, 4u);
  EXPECT_EQ(config.default_limits.max_waiting, 100u);
  ASSERT_EQ(config.per_user.size(), 2u);
  EXPECT_EQ(config.per_user.at("alice").max_gpus, 8u);
  EXPECT_EQ(config.per_user.at("alice").max_waiting, 200u);
  EXPECT_FALSE(config.per_user.at("bob.smith").max_gpus);
  EXPECT_EQ(config.per_user.at("bob.smith").max_waiting, 0u);
}

TEST(ConfigParseTest, ReadsBothPolicies) {
  EXPECT_EQ(parse_config("policy = \"fifo\"", kSource).policy, QueuePolicy::kFifo);
  EXPECT_EQ(parse_config("policy = \"fair-share\"", kSource).policy, QueuePolicy::kFairShare);
  EXPECT_EQ(parse_config("policy = 'fifo'  # literal string", kSource).policy, QueuePolicy::kFifo);
}

TEST(ConfigParseTest, AcceptsDottedKeysAndInlineTables) {
  const Config config = parse_config(R"(
limits.max_gpus_per_user = 2
limits.users = { carol = { max_gpus = 3 }, dave = {} }
)",
                                     kSource);
  EXPECT_EQ(config.default_limits.max_gpus, 2u);
  EXPECT_EQ(config.per_user.at("carol").max_gpus, 3u);
  EXPECT_FALSE(config.per_user.at("dave").max_gpus);
  EXPECT_FALSE(config.per_user.at("dave").max_waiting);
}

TEST(ConfigParseTest, AcceptsTheBoundsOfEveryLimit) {
  const Config config = parse_config(R"(
[limits]
max_gpus_per_user = 1
max_waiting_per_user = 0
[limits.users.alice]
max_gpus = 1000000
max_waiting = 1000000
)",
                                     kSource);
  EXPECT_EQ(config.default_limits.max_gpus, 1u);
  EXPECT_EQ(config.default_limits.max_waiting, 0u);
  EXPECT_EQ(config.per_user.at("alice").max_gpus, 1000000u);
  EXPECT_EQ(config.per_user.at("alice").max_waiting, 1000000u);
}

TEST(ConfigParseTest, ReadsTheSharedLeaseKeys) {
  const Config config =
      parse_config("max_jobs_per_gpu = 8\nshared_memory_reserve = \"2G\"\n", kSource);
  EXPECT_EQ(config.max_jobs_per_gpu, 8u);
  EXPECT_EQ(config.shared_memory_reserve_bytes, std::uint64_t{2} << 30);
  const Config none = parse_config("", kSource);
  EXPECT_FALSE(none.max_jobs_per_gpu);
  EXPECT_EQ(none.shared_memory_reserve_bytes, 0u);
  EXPECT_TRUE(Contains(ConfigError("max_jobs_per_gpu = 0\n"), "test.toml:1:"));
  EXPECT_TRUE(
      Contains(ConfigError("shared_memory_reserve = \"lots\"\n"), "'shared_memory_reserve'"));
  EXPECT_TRUE(Contains(ConfigError("shared_memory_reserve = 5\n"), "'shared_memory_reserve'"));
}

TEST(ConfigParseTest, EmptyExcludeListIsAccepted) {
  EXPECT_TRUE(parse_config("exclude_gpus = []", kSource).excluded_gpus.empty());
}

// --- limits_for ----------------------------------------------------------------------------

TEST(ConfigLimitsTest, PerUserFieldsOverrideDefaultsFieldByField) {
  const Config config = parse_config(R"(
[limits]
max_gpus_per_user = 4
max_waiting_per_user = 100
[limits.users.gpus_only]
max_gpus = 8
[limits.users.waiting_only]
max_waiting = 5
[limits.users.both]
max_gpus = 1
max_waiting = 0
[limits.users.neither]
)",
                                     kSource);
  UserLimits limits = config.limits_for("gpus_only");
  EXPECT_EQ(limits.max_gpus, 8u);
  EXPECT_EQ(limits.max_waiting, 100u);

  limits = config.limits_for("waiting_only");
  EXPECT_EQ(limits.max_gpus, 4u);
  EXPECT_EQ(limits.max_waiting, 5u);

  limits = config.limits_for("both");
  EXPECT_EQ(limits.max_gpus, 1u);
  EXPECT_EQ(limits.max_waiting, 0u);

  limits = config.limits_for("neither");
  EXPECT_EQ(limits.max_gpus, 4u);
  EXPECT_EQ(limits.max_waiting, 100u);

  limits = config.limits_for("someone_else");
  EXPECT_EQ(limits.max_gpus, 4u);
  EXPECT_EQ(limits.max_waiting, 100u);
}

TEST(ConfigLimitsTest, PerUserLimitsWithoutDefaults) {
  const Config config = parse_config("[limits.users.alice]\nmax_gpus = 2\n", kSource);
  EXPECT_EQ(config.limits_for("alice").max_gpus, 2u);
  EXPECT_FALSE(config.limits_for("alice").max_waiting);
  EXPECT_FALSE(config.limits_for("bob").max_gpus);
  EXPECT_FALSE(config.limits_for("bob").max_waiting);
}

TEST(ConfigLimitsTest, UserNamesAreMatchedExactly) {
  const Config config = parse_config("[limits.users.alice]\nmax_gpus = 2\n", kSource);
  EXPECT_FALSE(config.limits_for("Alice").max_gpus);
  EXPECT_FALSE(config.limits_for("alice ").max_gpus);
  EXPECT_FALSE(config.limits_for("").max_gpus);
}

// --- parse_config: malformed TOML ----------------------------------------------------------

TEST(ConfigParseTest, MalformedTomlNamesFileLineAndColumn) {
  const std::string message = ConfigError(
      "policy = \"fifo\"\n"
      "\n"
      "[limits]\n"
      "max_gpus_per_user = \n",
      "/etc/gpulock/config.toml");
  EXPECT_TRUE(StartsWith(message, "/etc/gpulock/config.toml:4:21: ")) << message;
}

TEST(ConfigParseTest, MalformedTomlVariants) {
  struct Case {
    const char* text;
    const char* prefix;
  };
  for (const Case& c : {
           Case{"policy = \"fifo", "test.toml:1:"},                         // unterminated string
           Case{"[limits\nmax_gpus_per_user = 1", "test.toml:1:"},          // unterminated header
           Case{"a = 1\nb = 2\nc = = 3\n", "test.toml:3:"},                 // stray '='
           Case{"policy = \"fifo\"\npolicy = \"fifo\"\n", "test.toml:2:"},  // duplicate key
           Case{"[limits]\n[limits]\n", "test.toml:2:"},                    // table defined twice
           Case{"[limits]\nmax_gpus_per_user = 99999999999999999999\n", "test.toml:2:"},
       }) {
    const std::string message = ConfigError(c.text);
    EXPECT_TRUE(StartsWith(message, c.prefix)) << c.text << "\n=> " << message;
  }
}

TEST(ConfigParseTest, InvalidUtf8AndNulBytesAreErrors) {
  EXPECT_TRUE(StartsWith(ConfigError("policy = \"fi\xff\xfe\"\n"), "test.toml:1:"));
  EXPECT_TRUE(StartsWith(ConfigError(std::string("policy = \"fifo\"\0\n", 17)), "test.toml:1:"));
  EXPECT_TRUE(StartsWith(ConfigError(std::string("# \0 comment\n", 12)), "test.toml:1:"));
}

// --- parse_config: the Redis backend's keys ---------------------------------------------------

TEST(ConfigParseTest, RedisBackendKeys) {
  const Config config = parse_config(
      "backend = \"redis://gpulock@hub:6380/2\"\npool = \"lab-1\"\nlease_ttl = \"45s\"\n"
      "redis_password_file = \"/etc/gpulock/redis.password\"\n",
      "test.toml");
  EXPECT_EQ(config.backend, "redis://gpulock@hub:6380/2");
  EXPECT_EQ(config.pool, "lab-1");
  EXPECT_EQ(config.lease_ttl, std::chrono::milliseconds(45000));
  EXPECT_EQ(config.redis_password_file, "/etc/gpulock/redis.password");
  EXPECT_EQ(parse_config("backend = \"file\"\n", "test.toml").backend, "file");
}

TEST(ConfigParseTest, BadRedisBackendValuesAreLocatedErrors) {
  EXPECT_TRUE(StartsWith(ConfigError("backend = \"http://hub\"\n"), "test.toml:1: 'backend'"));
  EXPECT_TRUE(
      StartsWith(ConfigError("\nbackend = \"redis://hub:0/0\"\n"), "test.toml:2: 'backend'"));
  EXPECT_TRUE(StartsWith(ConfigError("backend = 6379\n"), "test.toml:1: 'backend' must be"));
  EXPECT_TRUE(StartsWith(ConfigError("pool = \"a b\"\n"), "test.toml:1: 'pool'"));
  EXPECT_TRUE(StartsWith(ConfigError("pool = \"{x}\"\n"), "test.toml:1: 'pool'"));
  EXPECT_TRUE(StartsWith(ConfigError("pool = \"\"\n"), "test.toml:1: 'pool'"));
  EXPECT_TRUE(StartsWith(ConfigError("lease_ttl = \"100ms\"\n"), "test.toml:1: 'lease_ttl'"));
  EXPECT_TRUE(StartsWith(ConfigError("lease_ttl = \"2d\"\n"), "test.toml:1: 'lease_ttl'"));
  EXPECT_TRUE(StartsWith(ConfigError("lease_ttl = \"soon\"\n"), "test.toml:1: 'lease_ttl'"));
  EXPECT_TRUE(StartsWith(ConfigError("lease_ttl = true\n"), "test.toml:1: 'lease_ttl'"));
  EXPECT_TRUE(StartsWith(ConfigError("lease_ttl = 0\n"), "test.toml:1: 'lease_ttl'"));
  EXPECT_EQ(parse_config("lease_ttl = 30\n", "test.toml").lease_ttl,
            std::chrono::milliseconds(30000));
  EXPECT_TRUE(StartsWith(ConfigError("redis_password_file = [\"x\"]\n"),
                         "test.toml:1: 'redis_password_file' must be"));
}

// --- parse_config: monitoring keys -----------------------------------------------------------

TEST(ConfigParseTest, MonitoringKeys) {
  const Config defaults = parse_config("", "test.toml");
  EXPECT_EQ(defaults.idle_after, std::chrono::minutes(30));
  EXPECT_FALSE(defaults.serve_show_commands);
  const Config config =
      parse_config("idle_after = \"1h30m\"\nserve_show_commands = true\n", "test.toml");
  EXPECT_EQ(config.idle_after, std::chrono::minutes(90));
  EXPECT_TRUE(config.serve_show_commands);
  EXPECT_EQ(parse_config("idle_after = 90\n", "test.toml").idle_after, std::chrono::seconds(90));
}

TEST(ConfigParseTest, BadMonitoringValuesAreLocatedErrors) {
  EXPECT_TRUE(StartsWith(ConfigError("idle_after = \"soon\"\n"), "test.toml:1: 'idle_after'"));
  EXPECT_TRUE(StartsWith(ConfigError("idle_after = 0\n"), "test.toml:1: 'idle_after'"));
  EXPECT_TRUE(StartsWith(ConfigError("idle_after = \"31d\"\n"), "test.toml:1: 'idle_after'"));
  EXPECT_TRUE(StartsWith(ConfigError("serve_show_commands = \"yes\"\n"),
                         "test.toml:1: 'serve_show_commands' must be"));
}

// --- parse_config: unknown keys ------------------------------------------------------------

TEST(ConfigParseTest, UnknownTopLevelKeyIsNamedWithItsLine) {
  EXPECT_EQ(ConfigError("# gpulock\npolcy = \"fifo\"\n"),
            "test.toml:2: unknown key 'polcy' (known: policy, exclude_gpus, limits, backend, pool, "
            "lease_ttl, redis_password_file, idle_after, serve_show_commands, journal_dir, "
            "journal_file_size, max_jobs_per_gpu, shared_memory_reserve, jobs_dir, "
            "job_logs_readable, job_log_size)");
}

TEST(ConfigParseTest, UnknownTopLevelTableIsNamedWithItsLine) {
  // The Redis backend's settings are top-level keys; a [redis] table is unknown.
  EXPECT_EQ(ConfigError("policy = \"fifo\"\n\n[redis]\nurl = \"redis://localhost\"\n"),
            "test.toml:3: unknown key 'redis' (known: policy, exclude_gpus, limits, backend, pool, "
            "lease_ttl, redis_password_file, idle_after, serve_show_commands, journal_dir, "
            "journal_file_size, max_jobs_per_gpu, shared_memory_reserve, jobs_dir, "
            "job_logs_readable, job_log_size)");
  EXPECT_EQ(ConfigError("[limit]\nmax_gpus_per_user = 1\n"),
            "test.toml:1: unknown key 'limit' (known: policy, exclude_gpus, limits, backend, pool, "
            "lease_ttl, redis_password_file, idle_after, serve_show_commands, journal_dir, "
            "journal_file_size, max_jobs_per_gpu, shared_memory_reserve, jobs_dir, "
            "job_logs_readable, job_log_size)");
}

TEST(ConfigParseTest, UnknownKeyInLimits) {
  EXPECT_EQ(ConfigError("[limits]\nmax_gpus_per_user = 4\nmax_gpus = 4\n"),
            "test.toml:3: unknown key 'max_gpus' in [limits] "
            "(known: max_gpus_per_user, max_waiting_per_user, users)");
  EXPECT_EQ(ConfigError("\n[limits.user.alice]\nmax_gpus = 4\n"),
            "test.toml:2: unknown key 'user' in [limits] "
            "(known: max_gpus_per_user, max_waiting_per_user, users)");
}

TEST(ConfigParseTest, UnknownKeyInUserTable) {
  EXPECT_EQ(ConfigError("[limits.users.alice]\nmax_gpus = 8\n\nmax_gpus_per_user = 8\n"),
            "test.toml:4: unknown key 'max_gpus_per_user' in [limits.users.alice] "
            "(known: max_gpus, max_waiting)");
  EXPECT_EQ(ConfigError("[limits.users.alice.extra]\n"),
            "test.toml:1: unknown key 'extra' in [limits.users.alice] "
            "(known: max_gpus, max_waiting)");
  // A user name that is not a bare TOML key is shown quoted, as it would be written.
  EXPECT_EQ(ConfigError("[limits.users.\"bob.smith\"]\nmax_gpu = 1\n"),
            "test.toml:2: unknown key 'max_gpu' in [limits.users.\"bob.smith\"] "
            "(known: max_gpus, max_waiting)");
}

// --- parse_config: wrong types -------------------------------------------------------------

TEST(ConfigParseTest, WrongTypesAreNamed) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"[limits]\nmax_gpus_per_user = \"4\"\n",
                "test.toml:2: 'max_gpus_per_user' must be an integer, not a string"},
           Case{"[limits]\nmax_waiting_per_user = 1.5\n",
                "test.toml:2: 'max_waiting_per_user' must be an integer, not a floating-point "
                "number"},
           Case{"[limits.users.alice]\nmax_gpus = true\n",
                "test.toml:2: 'max_gpus' in [limits.users.alice] must be an integer, not a "
                "boolean"},
           Case{"[limits.users.alice]\nmax_waiting = [1]\n",
                "test.toml:2: 'max_waiting' in [limits.users.alice] must be an integer, not an "
                "array"},
           Case{"policy = 1\n", "test.toml:1: 'policy' must be a string, not an integer"},
           Case{"policy = [\"fifo\"]\n", "test.toml:1: 'policy' must be a string, not an array"},
           Case{"exclude_gpus = \"7\"\n",
                "test.toml:1: 'exclude_gpus' must be an array of strings, not a string"},
           Case{"limits = 4\n", "test.toml:1: 'limits' must be a table, not an integer"},
           Case{"[limits]\nusers = \"alice\"\n",
                "test.toml:2: 'users' in [limits] must be a table, not a string"},
           Case{"[limits.users]\nalice = 4\n",
                "test.toml:2: 'alice' in [limits.users] must be a table, not an integer"},
           Case{"[limits]\nmax_gpus_per_user = 1979-05-27\n",
                "test.toml:2: 'max_gpus_per_user' must be an integer, not a date"},
       }) {
    EXPECT_EQ(ConfigError(c.text), c.message) << c.text;
  }
}

TEST(ConfigParseTest, UnknownPolicyIsNamed) {
  EXPECT_EQ(ConfigError("\npolicy = \"fare-share\"\n"),
            "test.toml:2: 'policy' must be 'fair-share' or 'fifo', not 'fare-share'");
  EXPECT_EQ(ConfigError("policy = \"FIFO\"\n"),
            "test.toml:1: 'policy' must be 'fair-share' or 'fifo', not 'FIFO'");
  EXPECT_EQ(ConfigError("policy = \"\"\n"),
            "test.toml:1: 'policy' must be 'fair-share' or 'fifo', not ''");
}

// --- parse_config: values out of range -----------------------------------------------------

TEST(ConfigParseTest, LimitsOutOfRangeAreNamed) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"[limits]\nmax_gpus_per_user = 0\n",
                "test.toml:2: 'max_gpus_per_user' must be from 1 to 1000000, not 0"},
           Case{"[limits]\nmax_gpus_per_user = -1\n",
                "test.toml:2: 'max_gpus_per_user' must be from 1 to 1000000, not -1"},
           Case{"[limits]\nmax_gpus_per_user = 1000001\n",
                "test.toml:2: 'max_gpus_per_user' must be from 1 to 1000000, not 1000001"},
           Case{"[limits]\nmax_waiting_per_user = -5\n",
                "test.toml:2: 'max_waiting_per_user' must be from 0 to 1000000, not -5"},
           Case{"[limits]\nmax_waiting_per_user = 9223372036854775807\n",
                "test.toml:2: 'max_waiting_per_user' must be from 0 to 1000000, not "
                "9223372036854775807"},
           Case{"[limits]\nmax_waiting_per_user = -9223372036854775808\n",
                "test.toml:2: 'max_waiting_per_user' must be from 0 to 1000000, not "
                "-9223372036854775808"},
           Case{"[limits.users.alice]\nmax_gpus = 0\n",
                "test.toml:2: 'max_gpus' in [limits.users.alice] must be from 1 to 1000000, not 0"},
           Case{"[limits.users.alice]\nmax_gpus = 4294967297\n",  // 2^32 + 1: no wrap to 1
                "test.toml:2: 'max_gpus' in [limits.users.alice] must be from 1 to 1000000, not "
                "4294967297"},
           Case{"[limits.users.alice]\nmax_waiting = -1\n",
                "test.toml:2: 'max_waiting' in [limits.users.alice] must be from 0 to 1000000, "
                "not -1"},
       }) {
    EXPECT_EQ(ConfigError(c.text), c.message) << c.text;
  }
}

// --- parse_config: exclude_gpus entries ----------------------------------------------------

TEST(ConfigParseTest, ExcludeGpusEntriesMustBeNonEmptyStrings) {
  EXPECT_EQ(ConfigError("exclude_gpus = [\"7\",\n  7]\n"),
            "test.toml:2: 'exclude_gpus' entries must be strings, not an integer");
  EXPECT_EQ(ConfigError("exclude_gpus = [[\"7\"]]\n"),
            "test.toml:1: 'exclude_gpus' entries must be strings, not an array");
  for (const char* text : {"exclude_gpus = [\"7\", \"\"]\n", "exclude_gpus = [\"  \"]\n"}) {
    const std::string message = ConfigError(text);
    EXPECT_TRUE(StartsWith(message, "test.toml:1: 'exclude_gpus' entries must not be empty"))
        << message;
  }
}

TEST(ConfigParseTest, ExcludeGpusEntriesWithControlCharactersAreRefused) {
  const std::string message = ConfigError("exclude_gpus = [\"GPU-\\u001b[2J\"]\n");
  EXPECT_TRUE(StartsWith(message, "test.toml:1: 'exclude_gpus' entry 'GPU-?[2J'")) << message;
}

// --- parse_config: user names and untrusted text in messages -------------------------------

TEST(ConfigParseTest, EmptyUserNameIsRefused) {
  EXPECT_EQ(ConfigError("[limits.users.\"\"]\nmax_gpus = 1\n"),
            "test.toml:1: a user name in [limits.users] is empty");
}

TEST(ConfigParseTest, UserNameWithControlCharactersIsRefused) {
  const std::string message = ConfigError("[limits.users.\"al\\u0007ice\"]\nmax_gpus = 1\n");
  EXPECT_TRUE(StartsWith(message, "test.toml:1: user name 'al?ice' in [limits.users]")) << message;
}

TEST(ConfigParseTest, MessagesShowNoControlCharacters) {
  const auto expect_clean = [](const std::string& message) {
    EXPECT_FALSE(message.empty());
    for (const char c : message) {
      const auto byte = static_cast<unsigned char>(c);
      EXPECT_FALSE(byte < 0x20 || byte == 0x7f) << "control character in: " << message;
    }
  };
  // A key spelt with an escape sequence, a policy value, and a file name.
  expect_clean(ConfigError("\"pol\\u001b[31micy\" = 1\n"));
  expect_clean(ConfigError("policy = \"\\u001b]0;owned\\u0007\"\n"));
  expect_clean(ConfigError("[limits.users.alice]\n\"x\\ny\" = 1\n"));
  expect_clean(ConfigError("policy = 1\n", "evil\x1b[2J.toml"));
  expect_clean(ConfigError("policy = \n", "evil\r\n.toml"));
  EXPECT_TRUE(StartsWith(ConfigError("policy = 1\n", "evil\x1b[2J.toml"), "evil?[2J.toml:1:"));
}

TEST(ConfigParseTest, VeryLongKeysAreShortenedInMessages) {
  const std::string key(5000, 'k');
  const std::string message = ConfigError(key + " = 1\n");
  EXPECT_TRUE(StartsWith(message, "test.toml:1: unknown key 'kkk")) << message;
  // The key is shortened; the rest is the list of known keys.
  EXPECT_LT(message.size(), 400u);
}

// --- config_path and load_config -----------------------------------------------------------

// Saves GPULOCK_CONFIG and restores it (or its absence) after each test.
class ConfigLoadTest : public ::testing::Test {
 protected:
  ConfigLoadTest() {
    if (const char* old = std::getenv("GPULOCK_CONFIG")) saved_ = old;
  }
  ~ConfigLoadTest() override {
    if (saved_) {
      ::setenv("GPULOCK_CONFIG", saved_->c_str(), 1);
    } else {
      ::unsetenv("GPULOCK_CONFIG");
    }
  }

  void UseConfig(const fs::path& path) { ::setenv("GPULOCK_CONFIG", path.c_str(), 1); }

  fs::path Write(const std::string& name, const std::string& text) {
    const fs::path path = dir_.path() / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // load_config() expecting Error(kConfig); returns its message.
  std::string LoadError() {
    try {
      load_config();
      ADD_FAILURE() << "no error from load_config()";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kConfig) << error.what();
      return error.what();
    }
    return "";
  }

  TempDir dir_{"config"};

 private:
  std::optional<std::string> saved_;
};

TEST_F(ConfigLoadTest, ConfigPathDefaultsToEtc) {
  ::unsetenv("GPULOCK_CONFIG");
  EXPECT_EQ(config_path(), "/etc/gpulock/config.toml");
  ::setenv("GPULOCK_CONFIG", "", 1);
  EXPECT_EQ(config_path(), "/etc/gpulock/config.toml");
  ::setenv("GPULOCK_CONFIG", "/srv/gpulock.toml", 1);
  EXPECT_EQ(config_path(), "/srv/gpulock.toml");
}

TEST_F(ConfigLoadTest, ReadsTheFileNamedByGpulockConfig) {
  const fs::path path =
      Write("config.toml", "policy = \"fifo\"\n[limits]\nmax_gpus_per_user = 3\n");
  UseConfig(path);
  const Config config = load_config();
  EXPECT_EQ(config.policy, QueuePolicy::kFifo);
  EXPECT_EQ(config.default_limits.max_gpus, 3u);
  EXPECT_EQ(config.source, path.string());
}

TEST_F(ConfigLoadTest, EmptyFileGivesDefaults) {
  const fs::path path = Write("config.toml", "");
  UseConfig(path);
  const Config config = load_config();
  EXPECT_EQ(config.policy, QueuePolicy::kFairShare);
  EXPECT_FALSE(config.default_limits.max_gpus);
  EXPECT_EQ(config.source, path.string());
}

TEST_F(ConfigLoadTest, InvalidFileIsReportedWithItsPathAndLine) {
  const fs::path path = Write("config.toml", "policy = \"fifo\"\nmax_gpus_per_user = 4\n");
  UseConfig(path);
  EXPECT_EQ(LoadError(),
            path.string() +
                ":2: unknown key 'max_gpus_per_user' (known: policy, exclude_gpus, "
                "limits, backend, pool, lease_ttl, redis_password_file, idle_after, "
                "serve_show_commands, journal_dir, journal_file_size, max_jobs_per_gpu, "
                "shared_memory_reserve, jobs_dir, job_logs_readable, job_log_size)");
}

TEST_F(ConfigLoadTest, MissingFileNamedByGpulockConfigIsAnError) {
  const fs::path path = dir_.path() / "absent.toml";
  UseConfig(path);
  const std::string message = LoadError();
  EXPECT_TRUE(Contains(message, path.string())) << message;
  EXPECT_TRUE(Contains(message, "does not exist")) << message;
  EXPECT_TRUE(Contains(message, "GPULOCK_CONFIG")) << message;
}

TEST_F(ConfigLoadTest, DirectoryIsAnError) {
  UseConfig(dir_.path());
  const std::string message = LoadError();
  EXPECT_TRUE(Contains(message, dir_.path().string())) << message;
  EXPECT_TRUE(Contains(message, "is a directory")) << message;
}

TEST_F(ConfigLoadTest, FifoIsRefusedWithoutHanging) {
  const fs::path path = dir_.path() / "config.toml";
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  UseConfig(path);
  auto result = std::async(std::launch::async, [this] { return LoadError(); });
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    // Let the blocked reader go (opening the other end wakes it) so the test can end.
    const int writer = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) ::close(writer);
    ADD_FAILURE() << "load_config() hung on a FIFO";
  }
  const std::string message = result.get();
  EXPECT_TRUE(Contains(message, "is not a regular file")) << message;
}

TEST_F(ConfigLoadTest, DeviceIsAnError) {
  UseConfig("/dev/null");
  EXPECT_EQ(LoadError(), "config file /dev/null is not a regular file");
}

TEST_F(ConfigLoadTest, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their mode";
  const fs::path path = Write("config.toml", "policy = \"fifo\"\n");
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  UseConfig(path);
  const std::string message = LoadError();
  EXPECT_EQ(message, "cannot read " + path.string() + ": Permission denied");
}

TEST_F(ConfigLoadTest, FileOverOneMiBIsAnError) {
  std::string text = "# padding\n";
  text.resize(1024 * 1024 + 1, '#');
  UseConfig(Write("config.toml", text));
  const std::string message = LoadError();
  EXPECT_TRUE(Contains(message, "larger than 1 MiB")) << message;
}

TEST_F(ConfigLoadTest, FileOfExactlyOneMiBIsRead) {
  std::string text = "policy = \"fifo\"\n#";
  text.resize(1024 * 1024, '#');
  UseConfig(Write("config.toml", text));
  EXPECT_EQ(load_config().policy, QueuePolicy::kFifo);
}

TEST_F(ConfigLoadTest, SymlinkIsFollowed) {
  const fs::path target = Write("real.toml", "policy = \"fifo\"\n");
  const fs::path link = dir_.path() / "config.toml";
  fs::create_symlink(target, link);
  UseConfig(link);
  const Config config = load_config();
  EXPECT_EQ(config.policy, QueuePolicy::kFifo);
  EXPECT_EQ(config.source, link.string());
}

TEST_F(ConfigLoadTest, SymlinkLoopIsAnError) {
  const fs::path first = dir_.path() / "a.toml";
  const fs::path second = dir_.path() / "b.toml";
  fs::create_symlink(second, first);
  fs::create_symlink(first, second);
  UseConfig(first);
  const std::string message = LoadError();
  EXPECT_TRUE(Contains(message, first.string())) << message;
  EXPECT_TRUE(Contains(message, "symbolic links")) << message;
}

TEST_F(ConfigLoadTest, DanglingSymlinkNamedByGpulockConfigIsAnError) {
  const fs::path link = dir_.path() / "config.toml";
  fs::create_symlink(dir_.path() / "gone.toml", link);
  UseConfig(link);
  EXPECT_TRUE(Contains(LoadError(), "does not exist"));
}

}  // namespace
}  // namespace gpulock
