// launch_job(): a job's supervisor, started detached (its own session, no terminal).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "gpulock/jobs.hpp"
#include "util/fd.h"

namespace gpulock {
namespace {

// The job's end when its supervisor could not be started; then the error.
[[noreturn]] void failed_to_start(const JobStore::Created& job, const std::string& why) {
  JobProgress failed;
  failed.state = JobState::kFailed;
  failed.ended_unix = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  failed.reason = "its supervisor could not start: " + why;
  try {
    write_job_progress(job.directory, failed);
  } catch (const Error&) {
    // The record stays as it was; with no lock held it reads as lost.
  }
  throw Error(ErrorCode::kEnvironment, fmt::format("job {}: {}", job.id, failed.reason));
}

}  // namespace

void launch_job(JobStore::Created& job, const std::string& program,
                const std::vector<std::string>& argv) {
  UniqueFd lock(std::exchange(job.lock_fd, -1));
  // Everything the child needs, made before the fork: after it, only async-signal-safe calls.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string out = (job.directory / "stdout").string();
  const std::string err = (job.directory / "stderr").string();
  int ready[2];  // the grandchild's exec closes it; an error number comes through it otherwise
  if (::pipe2(ready, O_CLOEXEC) != 0) failed_to_start(job, errno_message("pipe2", errno));
  const pid_t child = ::fork();
  if (child == 0) {
    // The child only makes the grandchild, which the init process (or a subreaper) adopts when
    // the child exits: the caller has no zombie to reap, and the supervisor no parent to lose.
    ::close(ready[0]);
    if (::setsid() < 0) ::_exit(70);
    const pid_t grandchild = ::fork();
    if (grandchild != 0) ::_exit(grandchild < 0 ? 70 : 0);
    // Out of the way of descriptors 0 to 4 first, which are set up next.
    int report = ::fcntl(ready[1], F_DUPFD_CLOEXEC, 100);
    const int held = ::fcntl(lock.get(), F_DUPFD_CLOEXEC, 100);
    int error = 0;
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const int out_fd = ::open(out.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    const int err_fd = ::open(err.c_str(), O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    if (report < 0 || held < 0 || null_fd < 0 || out_fd < 0 || err_fd < 0 ||
        ::dup2(null_fd, 0) < 0 || ::dup2(out_fd, 1) < 0 || ::dup2(err_fd, 2) < 0 ||
        ::dup2(held, 3) < 0 || ::dup3(report, 4, O_CLOEXEC) < 0) {
      error = errno;
      if (report < 0) report = ready[1];
    } else {
      report = 4;
      ::close_range(5, ~0U, 0);
      ::execv(program.c_str(), args.data());
      error = errno;
    }
    [[maybe_unused]] const ssize_t n = ::write(report, &error, sizeof error);
    ::_exit(70);
  }
  const int fork_error = errno;
  ::close(ready[1]);
  UniqueFd ready_fd(ready[0]);
  if (child < 0) failed_to_start(job, errno_message("fork", fork_error));
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  // The middle child exits 0 once the supervisor is forked (it cannot fork: 70).
  const bool forked = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  int error = 0;
  ssize_t n = 0;
  if (forked)
    while ((n = ::read(ready_fd.get(), &error, sizeof error)) < 0 && errno == EINTR) {
    }
  lock.reset();  // the supervisor holds the lock now (or nobody, if it failed to start)
  if (!forked) failed_to_start(job, "no process to be had (fork failed)");
  if (n == static_cast<ssize_t>(sizeof error))
    failed_to_start(job, errno_message("cannot run " + program, error));
}

}  // namespace gpulock
