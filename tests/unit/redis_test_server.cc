// RedisTestServer: fork/exec of a real redis-server for the unit tests.
#include "redis_test_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "gpulock/error.hpp"

namespace gpulock::test_support {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Hang guards.
constexpr auto kStartHang = 30s;
constexpr auto kStopHang = 10s;
constexpr int kPortAttempts = 5;

bool executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0 &&
         std::filesystem::is_regular_file(path);
}

// Reaps the child if it has exited; true if it has.
bool reaped(pid_t pid, int* status) {
  while (true) {
    const pid_t done = ::waitpid(pid, status, WNOHANG);
    if (done == pid) return true;
    if (done < 0 && errno == EINTR) continue;
    return done < 0;  // ECHILD: not ours any more
  }
}

}  // namespace

std::string redis_server_binary() {
  if (const char* named = std::getenv("GPULOCK_REDIS_SERVER"); named && executable(named))
    return named;
  if (executable("/usr/bin/redis-server")) return "/usr/bin/redis-server";
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':'))
      if (!dir.empty() && executable(dir + "/redis-server")) return dir + "/redis-server";
  }
  throw std::runtime_error(
      "redis-server is not installed (apt-get install redis-server; scripts/install-deps "
      "installs it): the Redis backend tests need a real server and do not skip without one");
}

int closed_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

RedisTestServer::RedisTestServer(RedisTestServerOptions options)
    : options_(std::move(options)), log_path_(dir_.path() / "redis.log") {
  start();
}

RedisTestServer::~RedisTestServer() {
  try {
    stop();
  } catch (...) {
    kill_now();
  }
}

std::string RedisTestServer::url(const std::string& user, const std::string& password,
                                 int db) const {
  std::string login;
  if (!user.empty() || !password.empty())
    login = password.empty() ? user + "@" : user + ":" + password + "@";
  return "redis://" + login + "127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(db);
}

RedisEndpoint RedisTestServer::endpoint() const {
  RedisEndpoint endpoint;
  endpoint.host = "127.0.0.1";
  endpoint.port = port_;
  endpoint.password = options_.password;
  return endpoint;
}

std::unique_ptr<RedisConnection> RedisTestServer::connect(std::chrono::milliseconds timeout) const {
  return RedisConnection::connect(endpoint(), timeout);
}

RedisValue RedisTestServer::command(const std::vector<std::string>& args) {
  for (int attempt = 0;; ++attempt) {
    try {
      if (!admin_ || admin_->broken()) admin_ = connect();
      return admin_->command(args);
    } catch (const Error&) {
      admin_.reset();
      if (attempt == 1) throw;
    }
  }
}

std::string RedisTestServer::log_tail(std::size_t limit) const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > limit ? all.substr(all.size() - limit) : all;
}

void RedisTestServer::start() {
  if (running()) throw std::runtime_error("redis-server is already running");
  const bool first = port_ == 0;
  for (int attempt = 0; attempt < (first ? kPortAttempts : 1); ++attempt) {
    const int port = first ? closed_loopback_port() : port_;
    if (start_on(port)) {
      port_ = port;
      return;
    }
  }
  throw std::runtime_error("could not start redis-server: its port was taken each time\n" +
                           log_tail());
}

bool RedisTestServer::start_on(int port) {
  const std::string binary = redis_server_binary();
  std::error_code ignored;
  const auto log_offset = std::filesystem::exists(log_path_, ignored)
                              ? std::filesystem::file_size(log_path_, ignored)
                              : std::uintmax_t{0};
  std::vector<std::string> args{binary,
                                "--port",
                                std::to_string(port),
                                "--bind",
                                "127.0.0.1",
                                "--save",
                                "",
                                "--appendonly",
                                "no",
                                "--dir",
                                dir_.path().string(),
                                "--logfile",
                                log_path_.string(),
                                "--daemonize",
                                "no",
                                "--protected-mode",
                                "no",
                                "--unixsocket",
                                "",
                                "--loglevel",
                                "notice"};
  if (!options_.password.empty()) {
    args.push_back("--requirepass");
    args.push_back(options_.password);
  }
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string dir = dir_.path().string();
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::setpgid(0, 0);
    const int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
    }
    ::close_range(3, ~0U, 0);
    if (::chdir(dir.c_str()) != 0) ::_exit(127);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;

  const auto deadline = Clock::now() + kStartHang;
  while (true) {
    int status = 0;
    if (reaped(pid_, &status)) {
      pid_ = -1;
      std::string log = log_tail(1 << 20);
      if (log.size() >= log_offset) log = log.substr(log_offset);
      if (log.find("Address already in use") != std::string::npos) return false;
      throw std::runtime_error("redis-server exited at start on port " + std::to_string(port) +
                               " (status " + std::to_string(status) + "):\n" + log);
    }
    try {
      RedisEndpoint probe = endpoint();
      probe.port = port;
      auto connection = RedisConnection::connect(probe, 500ms);
      const RedisValue pong = connection->command({"PING"});
      if (pong.text == "PONG") {
        connection->set_timeout(30s);
        if (options_.acl_user) {
          const RedisValue set = connection->command(
              {"ACL", "SETUSER", options_.acl_user->first, "reset", "on",
               ">" + options_.acl_user->second, "~gpulock:*", "&gpulock:*", "+@all"});
          if (set.is_error()) {
            kill_now();
            throw std::runtime_error("ACL SETUSER failed: " + set.text);
          }
        }
        admin_ = std::move(connection);
        return true;
      }
    } catch (const Error&) {
      // Not listening yet (or still loading): try again.
    }
    if (Clock::now() > deadline) {
      kill_now();
      throw std::runtime_error("redis-server on port " + std::to_string(port) +
                               " did not answer PING within the hang guard\n" + log_tail());
    }
    std::this_thread::sleep_for(20ms);
  }
}

void RedisTestServer::stop() {
  admin_.reset();
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + kStopHang;
  int status = 0;
  while (Clock::now() < deadline) {
    if (reaped(pid_, &status)) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(10ms);
  }
  kill_now();
}

void RedisTestServer::kill_now() {
  admin_.reset();
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace gpulock::test_support
