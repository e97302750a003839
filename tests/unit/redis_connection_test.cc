// RedisConnection (redis/redis_connection.h): replies as hiredis's reader builds them straight
// into RedisValues (nesting, nil, empty arrays, statuses and errors, a large bulk string), checked
// against a real server and against a fake one that sends exact bytes; a reply the protocol does
// not allow breaks the connection with kEnvironment and leaks nothing (the ASan build runs this).
#include "redis/redis_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "gpulock/error.hpp"
#include "redis_test_server.h"

namespace gpulock {
namespace {

using namespace std::chrono_literals;
using Type = RedisValue::Type;

TEST(RedisConnectionTest, NestedRepliesKeepEveryKindOfElement) {
  test_support::RedisTestServer server;
  auto connection = server.connect();
  // Lua false becomes a nil bulk string; {} an empty array.
  const RedisValue v = connection->command(
      {"EVAL", "return {'abc', {5, false, {'x'}}, {}, redis.status_reply('FINE'), 7}", "0"});
  ASSERT_EQ(v.type, Type::kArray);
  ASSERT_EQ(v.elements.size(), 5u);
  EXPECT_EQ(v.elements[0].type, Type::kString);
  EXPECT_EQ(v.elements[0].text, "abc");
  ASSERT_EQ(v.elements[1].type, Type::kArray);
  ASSERT_EQ(v.elements[1].elements.size(), 3u);
  EXPECT_EQ(v.elements[1].elements[0].type, Type::kInteger);
  EXPECT_EQ(v.elements[1].elements[0].integer, 5);
  EXPECT_EQ(v.elements[1].elements[1].type, Type::kNil);
  ASSERT_EQ(v.elements[1].elements[2].elements.size(), 1u);
  EXPECT_EQ(v.elements[1].elements[2].elements[0].text, "x");
  EXPECT_EQ(v.elements[2].type, Type::kArray);
  EXPECT_TRUE(v.elements[2].elements.empty());
  EXPECT_EQ(v.elements[3].type, Type::kStatus);
  EXPECT_EQ(v.elements[3].text, "FINE");
  EXPECT_EQ(v.elements[4].integer, 7);
  // Top-level kinds: nil, status, error, integer, a 1 MiB bulk string.
  EXPECT_TRUE(connection->command({"GET", "missing"}).is_nil());
  const RedisValue ok = connection->command({"SET", "k", std::string(1 << 20, 'z')});
  EXPECT_EQ(ok.type, Type::kStatus);
  EXPECT_EQ(ok.text, "OK");
  EXPECT_EQ(connection->command({"GET", "k"}).text, std::string(1 << 20, 'z'));
  const RedisValue error = connection->command({"NOSUCHCOMMAND"});
  EXPECT_TRUE(error.is_error());
  EXPECT_NE(error.text.find("unknown command"), std::string::npos) << error.text;
  EXPECT_FALSE(connection->broken());
}

// A server on a free loopback port that answers the first command it reads with `reply`, bytes as
// given, then keeps the connection open until the test ends.
class FakeServer {
 public:
  explicit FakeServer(std::string reply) : reply_(std::move(reply)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener_, 1) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      throw std::runtime_error("cannot listen on loopback");
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      client_ = ::accept(listener_, nullptr, nullptr);
      char buffer[4096];
      if (client_ >= 0 && ::read(client_, buffer, sizeof buffer) > 0)
        (void)!::write(client_, reply_.data(), reply_.size());
    });
  }
  ~FakeServer() {
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    if (client_ >= 0) ::close(client_);
    ::close(listener_);
  }
  RedisEndpoint endpoint() const { return RedisEndpoint{"127.0.0.1", port_, 0, "", ""}; }

 private:
  std::string reply_;
  int listener_ = -1;
  int client_ = -1;
  int port_ = 0;
  std::thread thread_;
};

TEST(RedisConnectionTest, ExactBytesFromTheServerAreReadAsSent) {
  FakeServer server("*4\r\n$3\r\nabc\r\n*-1\r\n*2\r\n:-9\r\n$0\r\n\r\n-ERR no\r\n");
  auto connection = RedisConnection::connect(server.endpoint(), 2000ms);
  const RedisValue v = connection->command({"ANYTHING"});
  ASSERT_EQ(v.type, Type::kArray);
  ASSERT_EQ(v.elements.size(), 4u);
  EXPECT_EQ(v.elements[0].text, "abc");
  EXPECT_EQ(v.elements[1].type, Type::kNil);  // a nil array
  ASSERT_EQ(v.elements[2].elements.size(), 2u);
  EXPECT_EQ(v.elements[2].elements[0].integer, -9);
  EXPECT_EQ(v.elements[2].elements[1].type, Type::kString);
  EXPECT_EQ(v.elements[2].elements[1].text, "");
  EXPECT_TRUE(v.elements[3].is_error());
  EXPECT_EQ(v.elements[3].text, "ERR no");
}

TEST(RedisConnectionTest, AReplyTheProtocolDoesNotAllowBreaksTheConnection) {
  // Half an array built, then a byte no reply starts with: the partial reply is freed.
  for (const std::string reply : {"*3\r\n$3\r\nabc\r\n*1\r\n?\r\n", "$-5\r\n", "*2\r\n:x\r\n"}) {
    FakeServer server(reply);
    auto connection = RedisConnection::connect(server.endpoint(), 2000ms);
    try {
      connection->command({"ANYTHING"});
      ADD_FAILURE() << "accepted " << reply;
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kEnvironment) << error.what();
    }
    EXPECT_TRUE(connection->broken()) << reply;
  }
}

}  // namespace
}  // namespace gpulock
