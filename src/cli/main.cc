// gpulock's main(): parses the command line and maps errors to the documented exit statuses
// (64 usage, 69 cannot be served, 70 internal, 75 not served in time, 78 bad config;
// docs/cli.md).
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "cli.h"

namespace {

// Opens /dev/null on any of stdin, stdout and stderr that is closed, so that no file gpulock
// opens can land there (and be written to as if it were output).
void ensure_standard_descriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    if (fd == STDOUT_FILENO) gpulock::cli::stdout_was_closed = true;
    const int null_fd = ::open("/dev/null", O_RDWR);
    if (null_fd >= 0 && null_fd != fd) {
      ::dup2(null_fd, fd);
      ::close(null_fd);
    }
  }
}

// Whether whoever read our output has gone: the read end of the pipe (or socket) on stdout is
// closed. poll() says so with POLLERR (POLLHUP for a socket); a full disk says nothing.
bool output_reader_gone() {
  pollfd out{STDOUT_FILENO, 0, 0};
  return ::poll(&out, 1, 0) == 1 && (out.revents & (POLLERR | POLLHUP)) != 0;
}

// Ends gpulock as any filter ends when its reader leaves (`gpulock status --pool | head`):
// killed by SIGPIPE, silently, so a shell prints nothing and `pipefail` sees 141. Only once the
// command is done: a command whose output matters (acquire) handles a failed write itself.
[[noreturn]] void end_by_sigpipe() {
  gpulock::cli::die_by_signal(SIGPIPE);
}

// Output that could not be written (a closed pipe, a full disk) is an error, not a success.
// `error` is the errno of the failed write when the caller knows it.
int check_output(int status, int error = 0) {
  if (std::fflush(stdout) != 0 && error == 0) error = errno;
  if (!std::ferror(stdout)) return status;
  if (status == 0 && output_reader_gone()) end_by_sigpipe();
  gpulock::cli::print_error("cannot write output: " +
                            std::string(std::strerror(error != 0 ? error : EIO)));
  return status == 0 ? 70 : status;
}

// `gpulock` alone: what to type next, on stderr (it is still bad usage: exit 64).
void print_short_help() {
  fmt::print(stderr,
             "gpulock: exclusive GPU leases that never go stale\n"
             "Usage: gpulock COMMAND [OPTIONS]   (`gpulock --help` lists every command)\n"
             "\n"
             "  gpulock status                   every GPU: free, leased (by whom), busy\n"
             "  gpulock run -n 1 -- CMD ARGS     lease a GPU, run the command on it\n"
             "  gpulock submit -n 1 -- CMD ARGS  queue the command as a job (gpulock jobs)\n"
             "  eval \"$(gpulock acquire -n 1)\"   lease a GPU for this shell\n"
             "  gpulock queue                    who waits for GPUs, in serving order\n");
}

// Parses the command line and runs the command; its exit status.
int run(CLI::App& app, int argc, char** argv, const int& exit_status) {
  using namespace gpulock;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11 says "A subcommand is required" for `gpulock rn`: name what was not understood.
    const std::string explained =
        cli::explain_usage_error(app, std::vector<std::string>(argv + 1, argv + argc));
    cli::print_error(explained.empty() ? e.what() : explained);
    fmt::print(stderr, "Run `gpulock --help` (or `gpulock COMMAND --help`) for usage.\n");
    return 64;
  } catch (const Error& e) {
    cli::print_error(e.what());
    return exit_status_for(e.code());
  } catch (const std::system_error& e) {
    // fmt::print throws this when stdout cannot be written: a failed output, not a bug.
    if (std::ferror(stdout)) return check_output(exit_status, e.code().value());
    cli::print_error(fmt::format("internal error: {}", e.what()));
    return 70;
  } catch (const std::exception& e) {
    cli::print_error(fmt::format("internal error: {}", e.what()));
    return 70;
  }
  return check_output(exit_status);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gpulock;
  ensure_standard_descriptors();
  // Write errors on a closed pipe become EPIPE, reported below, instead of killing gpulock
  // midway (e.g. after `acquire` has started its holder). Commands get SIGPIPE back (run.hpp).
  ::signal(SIGPIPE, SIG_IGN);
  // Large blocks (a status of 800 GPUs holds vectors of ~0.3-1 MB) from the heap, not each from
  // a fresh mmap that is unmapped when freed: freed heap memory is reused, so a short-lived
  // command faults in its peak memory once instead of every large block it ever had (~800 page
  // faults to ~600 for `status --pool` of 100 hosts; on a VM a fault can cost 15 us).
  ::mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  cli::command_line.assign(argv, argv + argc);
  CLI::App app{"gpulock: exclusive GPU leases that never go stale", "gpulock"};
  app.require_subcommand(1);
  app.fallthrough(false);
  int exit_status = 0;
  cli::add_run_command(app, &exit_status);
  cli::add_job_commands(app, &exit_status);
  cli::add_acquire_command(app, &exit_status);
  cli::add_release_command(app, &exit_status);
  cli::add_status_command(app, &exit_status);
  cli::add_queue_command(app, &exit_status);
  cli::add_gpus_command(app, &exit_status);
  cli::add_init_command(app, &exit_status);
  cli::add_doctor_command(app, &exit_status);
  cli::add_metrics_command(app, &exit_status);
  cli::add_serve_command(app, &exit_status);
  cli::add_usage_command(app, &exit_status);
  cli::add_log_command(app, &exit_status);
  cli::add_journal_command(app, &exit_status);
  cli::add_complete_command(app, &exit_status);
  app.add_subcommand("version", "Print gpulock's version")->callback([] {
    fmt::print("gpulock {}\n", GPULOCK_VERSION_STRING);
  });
  app.set_version_flag("-V,--version", fmt::format("gpulock {}", GPULOCK_VERSION_STRING),
                       "Print gpulock's version and exit");
  app.footer(
      "Exit status: the command's own for `run`; 64 bad usage; 69 can never be served;\n"
      "70 internal error; 75 no GPU within --timeout or with --no-wait;\n"
      "78 invalid config file (GPULOCK_CONFIG or /etc/gpulock/config.toml).");

  if (argc <= 1) {
    print_short_help();
    return 64;
  }
  const int status = run(app, argc, argv, exit_status);
  // A command whose output a shell runs (acquire for eval) stops that shell too.
  if (status != 0 && cli::output_on_failure) {
    fmt::print("{}", cli::output_on_failure(status));
    std::fflush(stdout);
  }
  return status;
}
