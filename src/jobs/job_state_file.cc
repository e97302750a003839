// The job state file's two checksummed slots: create_job_state, write_job_state, read_job_state.
#include "jobs/job_state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <optional>
#include <tuple>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "util/crc32.h"
#include "util/fd.h"
#include "util/strings.h"

namespace gpulock {
namespace {

constexpr std::size_t kFileBytes = 2 * kJobStateSlotBytes;
// "gpulock-job-state <sequence: 16 hex> <crc32: 8 hex> <length: 4 decimal>\n", then the text,
// then newlines to the slot's end.
constexpr std::string_view kMagic = "gpulock-job-state ";
constexpr std::size_t kHeaderBytes = 18 + 16 + 1 + 8 + 1 + 4 + 1;

struct Slot {
  std::uint64_t sequence = 0;
  std::string text;
};

[[noreturn]] void fail(const std::string& what, int error) {
  throw Error(ErrorCode::kEnvironment, errno_message(what, error));
}

std::string slot_bytes(std::uint64_t sequence, std::string_view text) {
  std::string bytes =
      fmt::format("{}{:016x} {:08x} {:04}\n", kMagic, sequence, crc32(text), text.size());
  bytes += text;
  bytes.resize(kJobStateSlotBytes, '\n');
  return bytes;
}

template <typename T>
std::optional<T> hex_number(std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The slot's record, if it is whole.
std::optional<Slot> parse_slot(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes || bytes.substr(0, kMagic.size()) != kMagic ||
      bytes[kHeaderBytes - 1] != '\n')
    return std::nullopt;
  const std::string_view header = bytes.substr(kMagic.size(), kHeaderBytes - 1 - kMagic.size());
  if (header[16] != ' ' || header[25] != ' ') return std::nullopt;
  const auto sequence = hex_number<std::uint64_t>(header.substr(0, 16));
  const auto checksum = hex_number<std::uint32_t>(header.substr(17, 8));
  const auto length = whole_number<std::size_t>(header.substr(26, 4));
  if (!sequence || !checksum || !length || *length > kMaxJobStateText ||
      kHeaderBytes + *length > bytes.size())
    return std::nullopt;
  const std::string_view text = bytes.substr(kHeaderBytes, *length);
  if (crc32(text) != *checksum) return std::nullopt;
  return Slot{*sequence, std::string(text)};
}

void write_whole(int fd, const std::string& bytes, off_t offset, const char* what) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::pwrite(fd, bytes.data() + done, bytes.size() - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(fmt::format("cannot write the job's {}", what), n < 0 ? errno : ENOSPC);
    done += static_cast<std::size_t>(n);
  }
}

UniqueFd open_state(int dir_fd, int flags) {
  UniqueFd fd(::openat(dir_fd, kJobStateFile, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) fail(fmt::format("cannot open the job's {}", kJobStateFile), errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::size_t>(st.st_size) != kFileBytes)
    throw Error(ErrorCode::kEnvironment, fmt::format("the job's {} is not a state file of {} bytes",
                                                     kJobStateFile, kFileBytes));
  return fd;
}

// Both slots, as read from the file (an unreadable one as nullopt).
std::pair<std::optional<Slot>, std::optional<Slot>> read_slots(int fd) {
  std::string bytes(kFileBytes, '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::pread(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(fmt::format("cannot read the job's {}", kJobStateFile), errno);
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  const std::string_view all(bytes.data(), done);
  return {parse_slot(all.substr(0, std::min(done, kJobStateSlotBytes))),
          done > kJobStateSlotBytes ? parse_slot(all.substr(kJobStateSlotBytes)) : std::nullopt};
}

void check_length(std::string_view text) {
  if (text.size() > kMaxJobStateText)
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("a job state record of {} bytes (at most {})", text.size(), kMaxJobStateText));
}

}  // namespace

void create_job_state(int dir_fd, std::string_view text) {
  check_length(text);
  UniqueFd fd(
      ::openat(dir_fd, kJobStateFile, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd) fail(fmt::format("cannot create the job's {}", kJobStateFile), errno);
  try {
    // Both slots written in full: every block the file will ever need is allocated now.
    write_whole(fd.get(), slot_bytes(1, text) + slot_bytes(0, text), 0, kJobStateFile);
    if (::fchmod(fd.get(), 0644) != 0) fail("cannot chmod the job's state", errno);
  } catch (...) {
    ::unlinkat(dir_fd, kJobStateFile, 0);
    throw;
  }
}

void write_job_state(int dir_fd, std::string_view text) {
  check_length(text);
  UniqueFd fd = open_state(dir_fd, O_RDWR);
  const auto [first, second] = read_slots(fd.get());
  const std::uint64_t newest = std::max(first ? first->sequence : 0, second ? second->sequence : 0);
  // The older slot, or one that is unreadable; the newest is left as it is.
  const bool into_first = !first || (second && first->sequence <= second->sequence);
  write_whole(fd.get(), slot_bytes(newest + 1, text),
              into_first ? 0 : static_cast<off_t>(kJobStateSlotBytes), kJobStateFile);
}

std::string read_job_state(int dir_fd) {
  UniqueFd fd = open_state(dir_fd, O_RDONLY);
  auto [first, second] = read_slots(fd.get());
  // Both slots torn at once takes two writes during one read: a second read settles it.
  for (int again = 0; again < 2 && !first && !second; ++again)
    std::tie(first, second) = read_slots(fd.get());
  if (!first && !second)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("the job's {} holds no whole record", kJobStateFile));
  if (!first) return std::move(second->text);
  if (!second) return std::move(first->text);
  return first->sequence >= second->sequence ? std::move(first->text) : std::move(second->text);
}

}  // namespace gpulock
