// UniqueFd: an owned file descriptor, closed on destruction; plus errno-message helpers.
#pragma once

#include <string>
#include <utility>

namespace gpulock {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "what: strerror(errno_value)".
std::string errno_message(const std::string& what, int errno_value);

// The file's first bytes, at most `limit` of them (fewer at its end or on a read error).
std::string read_prefix(int fd, std::size_t limit);

}  // namespace gpulock
