// parse_redis_url() and RedisEndpoint::display(): defaults, logins, escapes, IPv6, and every
// kind of malformed URL, whose messages must never show the password.
#include "redis/redis_url.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpulock/error.hpp"

namespace gpulock {
namespace {

constexpr const char* kSecret = "Sup3rS3cretPw";

// The message of the kInvalidArgument error that parsing `url` throws ("" and a test failure
// when it does not throw, or throws something else).
std::string ParseError(const std::string& url) {
  try {
    const RedisEndpoint endpoint = parse_redis_url(url);
    ADD_FAILURE() << "no error for " << url << " (parsed as " << endpoint.display() << ")";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << url << ": " << error.what();
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << url << ": not a gpulock::Error: " << error.what();
  }
  return "";
}

void ExpectRejected(const std::string& url, const std::string& words = "") {
  const std::string message = ParseError(url);
  EXPECT_NE(message.find(words), std::string::npos) << url << " -> " << message;
  EXPECT_NE(message.find("invalid Redis URL"), std::string::npos) << url << " -> " << message;
  EXPECT_EQ(message.find(kSecret), std::string::npos)
      << "the error for " << url << " shows the password: " << message;
}

TEST(RedisUrlTest, DefaultsToPort6379AndDatabase0) {
  const RedisEndpoint e = parse_redis_url("redis://gpu-hub");
  EXPECT_EQ(e.host, "gpu-hub");
  EXPECT_EQ(e.port, 6379);
  EXPECT_EQ(e.db, 0);
  EXPECT_EQ(e.user, "");
  EXPECT_EQ(e.password, "");
  EXPECT_EQ(e.display(), "redis://gpu-hub:6379/0");

  // A trailing slash (no database) and an empty port are the defaults too.
  EXPECT_EQ(parse_redis_url("redis://gpu-hub/").db, 0);
  EXPECT_EQ(parse_redis_url("redis://gpu-hub:/").port, 6379);
}

TEST(RedisUrlTest, HostPortAndDatabase) {
  const RedisEndpoint e = parse_redis_url("redis://10.0.0.7:6380/3");
  EXPECT_EQ(e.host, "10.0.0.7");
  EXPECT_EQ(e.port, 6380);
  EXPECT_EQ(e.db, 3);
  EXPECT_EQ(e.display(), "redis://10.0.0.7:6380/3");
  EXPECT_EQ(parse_redis_url("redis://h:1/0").port, 1);
  EXPECT_EQ(parse_redis_url("redis://h:65535/0").port, 65535);
  EXPECT_EQ(parse_redis_url("redis://my_host.example-1.org").host, "my_host.example-1.org");
}

TEST(RedisUrlTest, TheSchemeIsCaseInsensitive) {
  EXPECT_TRUE(is_redis_url("redis://h"));
  EXPECT_TRUE(is_redis_url("REDIS://h"));
  EXPECT_FALSE(is_redis_url("file"));
  EXPECT_FALSE(is_redis_url("rediss://h"));
  EXPECT_FALSE(is_redis_url("redis:/h"));
  EXPECT_FALSE(is_redis_url(""));
  EXPECT_EQ(parse_redis_url("Redis://h:7/1").port, 7);
}

TEST(RedisUrlTest, UserAndPassword) {
  const RedisEndpoint e = parse_redis_url(std::string("redis://alice:") + kSecret + "@hub:6379/2");
  EXPECT_EQ(e.user, "alice");
  EXPECT_EQ(e.password, kSecret);
  EXPECT_EQ(e.host, "hub");
  EXPECT_EQ(e.db, 2);
}

TEST(RedisUrlTest, PasswordWithoutUserAndUserWithoutPassword) {
  // redis://:password@host: the default user's password.
  const RedisEndpoint e = parse_redis_url(std::string("redis://:") + kSecret + "@hub");
  EXPECT_EQ(e.user, "");
  EXPECT_EQ(e.password, kSecret);
  // redis://user@host: a user whose password comes from elsewhere (GPULOCK_REDIS_PASSWORD).
  const RedisEndpoint user = parse_redis_url("redis://alice@hub");
  EXPECT_EQ(user.user, "alice");
  EXPECT_EQ(user.password, "");
  EXPECT_EQ(user.host, "hub");
  EXPECT_EQ(user.display(), "redis://alice@hub:6379/0");
  // redis://user:@host: an empty password is no password.
  const RedisEndpoint empty = parse_redis_url("redis://alice:@hub");
  EXPECT_EQ(empty.user, "alice");
  EXPECT_EQ(empty.password, "");
}

TEST(RedisUrlTest, PercentEscapesInTheLogin) {
  const RedisEndpoint e = parse_redis_url("redis://al%69ce:p%40ss%3Aw%2Fo%25rd@hub/0");
  EXPECT_EQ(e.user, "alice");
  EXPECT_EQ(e.password, "p@ss:w/o%rd");
  // Upper- and lower-case hex digits.
  EXPECT_EQ(parse_redis_url("redis://u:%7e%7E@h").password, "~~");
  // An unescaped '@' in the password: the host follows the last '@'.
  const RedisEndpoint at = parse_redis_url("redis://u:p@ss@hub:6390");
  EXPECT_EQ(at.password, "p@ss");
  EXPECT_EQ(at.host, "hub");
  EXPECT_EQ(at.port, 6390);
  // A ':' in the password needs no escape either (the first ':' ends the user).
  EXPECT_EQ(parse_redis_url("redis://u:a:b@hub").password, "a:b");
}

TEST(RedisUrlTest, MalformedEscapesAreRejectedWithoutShowingThePassword) {
  ExpectRejected(std::string("redis://u:") + kSecret + "%zz@hub", "malformed %-escape");
  ExpectRejected(std::string("redis://u:") + kSecret + "%4@hub", "truncated %-escape");
  ExpectRejected(std::string("redis://u:") + kSecret + "%@hub", "truncated %-escape");
  ExpectRejected(std::string("redis://u:") + kSecret + "%4g@hub", "malformed %-escape");
}

TEST(RedisUrlTest, Ipv6Hosts) {
  const RedisEndpoint e = parse_redis_url("redis://[::1]:6380/1");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 6380);
  EXPECT_EQ(e.db, 1);
  EXPECT_EQ(e.display(), "redis://[::1]:6380/1");
  const RedisEndpoint bare = parse_redis_url("redis://[fe80::1:2]");
  EXPECT_EQ(bare.host, "fe80::1:2");
  EXPECT_EQ(bare.port, 6379);
  EXPECT_EQ(bare.display(), "redis://[fe80::1:2]:6379/0");
  const RedisEndpoint login = parse_redis_url(std::string("redis://bob:") + kSecret + "@[::1]:7");
  EXPECT_EQ(login.host, "::1");
  EXPECT_EQ(login.port, 7);
  EXPECT_EQ(login.password, kSecret);

  ExpectRejected("redis://[::1", "unclosed '['");
  ExpectRejected("redis://[::1]6380", "text after the host");
  ExpectRejected("redis://[]:6380", "no host");
  ExpectRejected("redis://[::1]:0", "the port");
}

TEST(RedisUrlTest, OtherSchemesAreRejected) {
  ExpectRejected("http://hub:6379", "must start with redis://");
  ExpectRejected("hub:6379", "must start with redis://");
  ExpectRejected("", "must start with redis://");
  ExpectRejected("redis:/hub", "must start with redis://");
  ExpectRejected("unix:///run/redis.sock", "must start with redis://");
  ExpectRejected(std::string("http://alice:") + kSecret + "@hub", "must start with redis://");
}

TEST(RedisUrlTest, TlsIsNotSupported) {
  ExpectRejected("rediss://hub:6380", "TLS (rediss://) is not supported");
  ExpectRejected(std::string("rediss://alice:") + kSecret + "@hub:6380/0", "TLS");
  ExpectRejected("REDISS://hub", "TLS");
}

TEST(RedisUrlTest, AHostIsRequired) {
  ExpectRejected("redis://", "no host");
  ExpectRejected("redis://:6379", "no host");
  ExpectRejected("redis:///0", "no host");
  ExpectRejected(std::string("redis://alice:") + kSecret + "@", "no host");
  ExpectRejected(std::string("redis://alice:") + kSecret + "@:6379/0", "no host");
}

TEST(RedisUrlTest, BadPorts) {
  for (const std::string port :
       {"0", "70000", "65536", "abc", "-1", "12ab", "+80", " 80", "1e3", "99999999999999999999"})
    ExpectRejected(std::string("redis://alice:") + kSecret + "@hub:" + port + "/0", "the port");
}

TEST(RedisUrlTest, BadDatabases) {
  for (const std::string db : {"-1", "abc", "1/2", "0x1", "2147483648", "1048577", " 1"})
    ExpectRejected(std::string("redis://alice:") + kSecret + "@hub:6379/" + db,
                   "the database number");
  EXPECT_EQ(parse_redis_url("redis://hub/1048576").db, 1 << 20);
}

TEST(RedisUrlTest, QueryStringsAreRejected) {
  ExpectRejected("redis://hub:6379/0?timeout=5", "query parameters are not supported");
  ExpectRejected(std::string("redis://alice:") + kSecret + "@hub/0?ssl=true", "query parameters");
  ExpectRejected("redis://hub/?db=1", "query parameters");
  // Without a path, the '?' lands in the host or the port: still an error.
  ExpectRejected("redis://hub?db=1");
  ExpectRejected("redis://hub:6379?db=1");
}

TEST(RedisUrlTest, BadHostCharacters) {
  for (const std::string host :
       {"hub host", "hub;rm", "h\xc3\xb6st", "hub\n", "hub\x01", "hub%20", "hub$"}) {
    const std::string url = std::string("redis://alice:") + kSecret + "@" + host + ":6379/0";
    const std::string message = ParseError(url);
    EXPECT_FALSE(message.empty()) << url;
    EXPECT_EQ(message.find(kSecret), std::string::npos) << message;
    // Control characters are never echoed raw.
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(message.find('\x01'), std::string::npos) << message;
  }
  ExpectRejected("redis://hub host", "characters a host name cannot have");
}

TEST(RedisUrlTest, DisplayMasksThePassword) {
  const RedisEndpoint e = parse_redis_url(std::string("redis://alice:") + kSecret + "@hub:6390/4");
  EXPECT_EQ(e.display(), "redis://alice:***@hub:6390/4");
  const RedisEndpoint bare = parse_redis_url(std::string("redis://:") + kSecret + "@hub");
  EXPECT_EQ(bare.display(), "redis://:***@hub:6379/0");
  const RedisEndpoint escaped = parse_redis_url("redis://u:%53%75%70%33%72@hub");
  EXPECT_EQ(escaped.password, "Sup3r");
  EXPECT_EQ(escaped.display().find("Sup3r"), std::string::npos) << escaped.display();

  // An endpoint made by hand (a password from GPULOCK_REDIS_PASSWORD) is masked too.
  RedisEndpoint manual;
  manual.host = "hub";
  manual.password = kSecret;
  EXPECT_EQ(manual.display(), "redis://:***@hub:6379/0");
  manual.user = "bob";
  EXPECT_EQ(manual.display(), "redis://bob:***@hub:6379/0");
  manual.password.clear();
  EXPECT_EQ(manual.display(), "redis://bob@hub:6379/0");
}

TEST(RedisUrlTest, DisplayNeverShowsControlCharactersOfTheUser) {
  RedisEndpoint e;
  e.host = "hub";
  e.user = "bob\n\x1b[31m";
  e.password = kSecret;
  const std::string shown = e.display();
  EXPECT_EQ(shown.find('\n'), std::string::npos) << shown;
  EXPECT_EQ(shown.find('\x1b'), std::string::npos) << shown;
  EXPECT_EQ(shown.find(kSecret), std::string::npos) << shown;
}

// A URL that forgot "@host" after the login, e.g. "redis://alice:Sup3rS3cretPw/0", reads as
// host "alice" and port "Sup3rS3cretPw": the error must not echo the bad port, the password.
TEST(RedisUrlTest, APasswordMistakenForThePortIsNotEchoed) {
  ExpectRejected(std::string("redis://alice:") + kSecret + "/0", "the port");
  ExpectRejected(std::string("redis://alice:") + kSecret, "the port");
}

}  // namespace
}  // namespace gpulock
