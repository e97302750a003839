// `gpulock acquire [selection] [waiting] --for-pid PID`: lease for a shell session.
//
//   eval "$(gpulock acquire -n 1 --for-pid $$)"
//   read GPUID < <(gpulock acquire -n 1 --for-pid $$ --print-ids)
//
// prints `export` lines for eval (or, with --print-ids, one line: the GPUs as
// CUDA_VISIBLE_DEVICES would name them); a detached holder keeps the lease until PID exits or
// `gpulock release LEASE_ID`.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

std::string quoted(const std::string& value) {
  std::string out = "'";
  for (char c : value) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

void add_acquire_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "acquire", "Lease GPUs for a shell: prints export lines for eval, holds until PID exits");
  auto options = std::make_shared<RequestOptions>();
  auto for_pid = std::make_shared<int>(0);
  auto print_ids = std::make_shared<bool>(false);
  options->add_to(*command);
  command->add_option("--for-pid", *for_pid, "Keep the lease until this process exits (e.g. $$)")
      ->required();
  command->add_flag("--print-ids", *print_ids,
                    "Print only the GPUs, comma-separated as in CUDA_VISIBLE_DEVICES (for "
                    "read GPUID < <(...))");
  command->footer(
      "Examples: eval \"$(gpulock acquire -n 2 --for-pid $$)\"\n"
      "          read GPUID < <(gpulock acquire -n 1 --for-pid $$ --print-ids)");
  command->callback([options, for_pid, print_ids, exit_status] {
    if (stdout_was_closed)
      throw Error(ErrorCode::kInvalidArgument,
                  "standard output is closed: acquire prints the lease's export lines (or "
                  "GPU ids) there");
    // Check the process before waiting for GPUs that would be handed to nobody.
    // (kill with signal 0 only checks; EPERM means the process exists but is someone else's.)
    if (*for_pid <= 0 || (::kill(*for_pid, 0) != 0 && errno == ESRCH))
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("--for-pid {}: no such running process", *for_pid));
    GpuPool pool = open_pool(options->backend);
    Lease lease = acquire_for_cli(pool, *options, fmt::format("acquire --for-pid {}", *for_pid));
    const pid_t holder = detach_lease(lease, *for_pid);
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
      throw Error(ErrorCode::kInternal,
                  fmt::format("cannot write the lease's GPUs ({}); lease {} released",
                              std::strerror(error), lease.id()));
    }
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
