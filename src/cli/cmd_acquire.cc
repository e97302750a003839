// `gpulock acquire [selection] [waiting] [--for-pid PID]`: a lease for a shell.
//
//   eval "$(gpulock acquire -n 1)"
//   GPUID=$(gpulock acquire -n 1 --print-ids) || exit
//
// prints `export` lines for eval (or, with --print-ids, one line: the GPUs as
// CUDA_VISIBLE_DEVICES would name them); a detached holder keeps the lease until
// `gpulock release LEASE_ID`, or until no process of the caller's session is left (with
// --for-pid: until that process exits). When it fails, what it prints for eval stops the shell
// that runs it: a script exits with gpulock's status, an interactive shell abandons the command
// line as Ctrl-C would.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

std::string quoted(const std::string& value) {
  std::string out = "'";
  for (char c : value) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// For `eval`: a script (or subshell) exits with gpulock's status; an interactive shell, which
// `exit` would close, abandons the rest of the command line as on Ctrl-C (status 130).
std::string stop_the_shell(int status) {
  return fmt::format("case $- in *i*) kill -INT $$ ;; *) exit {} ;; esac\n", status);
}

// Warns once when a GPU in the request's way is held for --for-pid's process and that process
// is this command's own ancestor: the script then waits on itself. It looks at what the wait
// reports and, should the request fail before the wait said what held it up (the deadline can
// pass while it queues for the acquire mutex on a loaded machine), at the pool's holders.
class SelfWaitWarning {
 public:
  explicit SelfWaitWarning(pid_t for_pid)
      : for_pid_(for_pid > 0 && is_ancestor_of_caller(for_pid) ? for_pid : 0) {}

  std::function<void(const WaitProgress&)> on_progress() {
    if (for_pid_ == 0) return {};
    return [this](const WaitProgress& progress) {
      for (const BlockingGpu& b : progress.blocking)
        if (b.held_for_pid == for_pid_) return warn(b.display_index);
    };
  }

  // After the request timed out: a best-effort look, which must not hide the failure itself.
  void after_failure(GpuPool& pool) noexcept {
    if (for_pid_ == 0 || warned_) return;
    try {
      for (const GpuStatus& gpu : pool.status().gpus) {
        if (!gpu.holder) continue;
        const std::vector<int>& members = gpu.holder->member_pids;
        if (std::find(members.begin(), members.end(), for_pid_) != members.end())
          return warn(gpu.device.display_index());
      }
    } catch (const std::exception&) {
    }
  }

 private:
  void warn(const std::string& gpu) {
    if (warned_) return;
    warned_ = true;
    print_error(fmt::format(
        "warning: GPU {} is held until pid {} exits, and pid {} is this command's own "
        "ancestor (the script that runs it): unless that lease is released (`gpulock release`), "
        "it frees only after this wait ends, so the script waits on itself. For tasks in "
        "background subshells, leave out --for-pid: each lease is then held for the session "
        "until the task releases it (docs/cli.md, \"Tasks in background subshells\")",
        gpu, for_pid_, for_pid_));
  }

  pid_t for_pid_;
  bool warned_ = false;
};

}  // namespace

void add_acquire_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "acquire",
      "Lease GPUs for a shell: prints export lines for eval; held until released or until "
      "the session (or --for-pid's process) has no process left");
  auto options = std::make_shared<RequestOptions>();
  auto for_pid = std::make_shared<std::optional<int>>();
  auto print_ids = std::make_shared<bool>(false);
  options->add_to(*command);
  command->add_option("--for-pid", *for_pid,
                      "Hold the lease only until this process exits (default: until no process "
                      "of this session is left)");
  command->add_flag("--print-ids", *print_ids,
                    "Print only the GPUs, comma-separated as in CUDA_VISIBLE_DEVICES (for "
                    "GPUID=$(...))");
  command->footer(
      "Examples: eval \"$(gpulock acquire -n 2)\"; ...; gpulock release \"$GPULOCK_LEASE_ID\"\n"
      "          GPUID=$(gpulock acquire -n 1 --print-ids) || exit\n"
      "On failure nothing for `read` is printed; for `eval`, a line that stops the shell.");
  // Set before the options are parsed, so that a malformed option stops an `eval` too. Whether
  // --print-ids was given is read from the command line: parsing may have failed before it.
  command->preparse_callback([](std::size_t) {
    const bool ids =
        std::find(command_line.begin(), command_line.end(), "--print-ids") != command_line.end();
    if (!ids && ::isatty(STDOUT_FILENO) == 0) output_on_failure = stop_the_shell;
  });
  command->callback([options, for_pid, print_ids, exit_status] {
    if (stdout_was_closed)
      throw Error(ErrorCode::kInvalidArgument,
                  "standard output is closed: acquire prints the lease's export lines (or "
                  "GPU ids) there");
    // Check the process before waiting for GPUs that would be handed to nobody.
    const std::optional<int> pid = *for_pid;
    if (pid)
      for (const auto& warning : check_detached_owner(*pid)) print_error("warning: " + warning);
    GpuPool pool = open_pool(options->backend);
    const std::string what = pid ? fmt::format("acquire --for-pid {}", *pid)
                                 : fmt::format("acquire for session {}", ::getsid(0));
    SelfWaitWarning self_wait(pid.value_or(0));
    Lease lease;
    try {
      lease = acquire_for_cli(pool, *options, what, self_wait.on_progress());
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kTimedOut) self_wait.after_failure(pool);
      throw;
    }
    const pid_t holder = pid ? detach_lease(lease, *pid) : detach_lease_for_session(lease);
    int error = 0;
    try {
      for (const auto& [name, value] : lease_environment(lease, options->visible_format())) {
        if (!*print_ids)
          fmt::print("export {}={}\n", name, quoted(value));
        else if (name == "CUDA_VISIBLE_DEVICES")
          fmt::print("{}\n", value);
      }
      if (std::fflush(stdout) != 0) error = errno;
    } catch (const std::system_error& e) {
      error = e.code().value();  // fmt::print's write failed (more than stdio's buffer)
    }
    if (error != 0 || std::ferror(stdout)) {
      // Nobody learns the lease id, so nobody could use or release it: end it now.
      if (error == 0) error = EIO;
      ::kill(holder, SIGTERM);
      output_on_failure = nullptr;  // the output cannot be written
      throw Error(ErrorCode::kInternal,
                  fmt::format("cannot write the lease's GPUs ({}); lease {} released",
                              std::strerror(error), lease.id()));
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
