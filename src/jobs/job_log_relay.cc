// start_job_log_relay(): a job's output through pipes to its log files, each kept under a cap.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "gpulock/jobs.hpp"
#include "gpulock/parse.hpp"
#include "util/fd.h"

namespace gpulock {
namespace {

// One stream: the pipe it is read from, the log file it goes to, what that file holds.
struct Stream {
  int read_fd = -1;
  int file_fd = -1;
  std::uint64_t written = 0;
  bool capped = false;
};

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk: the output is lost, never the job
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// The relay process: from fork to _exit, only async-signal-safe calls (the supervisor may have
// threads). Ends when both pipes are closed by every writer.
[[noreturn]] void relay(Stream streams[2], std::uint64_t cap, const char* note,
                        std::size_t note_size) {
  char buffer[65536];
  pollfd fds[2];
  int open_count = 2;
  while (open_count > 0) {
    for (int i = 0; i < 2; ++i) fds[i] = {streams[i].read_fd, POLLIN, 0};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      ::_exit(1);
    }
    for (int i = 0; i < 2; ++i) {
      Stream& s = streams[i];
      if (s.read_fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = ::read(s.read_fd, buffer, sizeof buffer);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        ::close(s.read_fd);
        s.read_fd = -1;  // poll skips a negative descriptor
        --open_count;
        continue;
      }
      if (s.capped) continue;  // read, so that the writer never blocks, and dropped
      const std::uint64_t room = s.written < cap ? cap - s.written : 0;
      const std::size_t kept = static_cast<std::uint64_t>(n) < room
                                   ? static_cast<std::size_t>(n)
                                   : static_cast<std::size_t>(room);
      write_all(s.file_fd, buffer, kept);
      s.written += kept;
      if (kept < static_cast<std::size_t>(n)) {
        write_all(s.file_fd, note, note_size);
        s.capped = true;
      }
    }
  }
  ::_exit(0);
}

}  // namespace

void start_job_log_relay(std::uint64_t cap_bytes) {
  if (cap_bytes == 0) return;
  std::fflush(stdout);
  std::fflush(stderr);
  Stream streams[2];
  int pipes[2][2];
  for (int i = 0; i < 2; ++i) {
    const int file_fd = i + 1;
    struct stat st {};
    if (::fstat(file_fd, &st) != 0 || !S_ISREG(st.st_mode)) return;  // not a log file: as it is
    streams[i].written = static_cast<std::uint64_t>(st.st_size);
    streams[i].capped = streams[i].written >= cap_bytes;
    if (::pipe2(pipes[i], O_CLOEXEC) != 0) {
      if (i == 1) ::close(pipes[0][0]), ::close(pipes[0][1]);
      throw Error(ErrorCode::kEnvironment,
                  errno_message("cannot relay the job's output: pipe2", errno));
    }
  }
  const std::string note = fmt::format(
      "\ngpulock: this log reached its cap of {} (job_log_size in the config); the rest of the "
      "output was dropped\n",
      format_size(cap_bytes));
  const pid_t child = ::fork();
  if (child < 0) {
    const int error = errno;
    for (auto& p : pipes) ::close(p[0]), ::close(p[1]);
    throw Error(ErrorCode::kEnvironment,
                errno_message("cannot relay the job's output: fork", error));
  }
  if (child == 0) {
    // Only the pipes and the files: no lease or job lock may outlive the supervisor here.
    const int ignored[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE};
    for (const int signal : ignored) ::signal(signal, SIG_IGN);
    ::close(pipes[0][1]);
    ::close(pipes[1][1]);
    const int moved[4] = {::fcntl(1, F_DUPFD, 100), ::fcntl(2, F_DUPFD, 100),
                          ::fcntl(pipes[0][0], F_DUPFD, 100), ::fcntl(pipes[1][0], F_DUPFD, 100)};
    for (const int fd : moved)
      if (fd < 0) ::_exit(1);
    for (int i = 0; i < 4; ++i)
      if (::dup2(moved[i], i + 1) < 0) ::_exit(1);
    ::close_range(5, ~0U, 0);
    streams[0].file_fd = 1;
    streams[1].file_fd = 2;
    streams[0].read_fd = 3;
    streams[1].read_fd = 4;
    relay(streams, cap_bytes, note.data(), note.size());
  }
  // Here: standard output and error become the pipes' write ends (the command inherits them).
  ::close(pipes[0][0]);
  ::close(pipes[1][0]);
  const bool moved = ::dup2(pipes[0][1], 1) >= 0 && ::dup2(pipes[1][1], 2) >= 0;
  const int error = errno;
  ::close(pipes[0][1]);
  ::close(pipes[1][1]);
  if (!moved)
    throw Error(ErrorCode::kEnvironment,
                errno_message("cannot relay the job's output: dup2", error));
}

}  // namespace gpulock
