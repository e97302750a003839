// gpulock's main(): parses the command line and maps errors to the documented exit statuses
// (64 usage, 69 cannot be served, 70 internal, 75 not served in time; docs/cli.md).
#include <fmt/format.h>

#include "cli.h"

int main(int argc, char** argv) {
  using namespace gpulock;
  CLI::App app{"gpulock: exclusive GPU leases that never go stale", "gpulock"};
  app.require_subcommand(1);
  app.fallthrough(false);
  int exit_status = 0;
  cli::add_run_command(app, &exit_status);
  cli::add_acquire_command(app, &exit_status);
  cli::add_release_command(app, &exit_status);
  cli::add_status_command(app, &exit_status);
  cli::add_gpus_command(app, &exit_status);
  app.add_subcommand("version", "Print gpulock's version")->callback([] {
    fmt::print("gpulock {}\n", GPULOCK_VERSION_STRING);
  });
  app.footer(
      "Exit status: the command's own for `run`; 64 bad usage; 69 can never be served;\n"
      "70 internal error; 75 no GPU within --timeout or with --no-wait.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    cli::print_error(e.what());
    fmt::print(stderr, "Run `gpulock --help` (or `gpulock COMMAND --help`) for usage.\n");
    return 64;
  } catch (const Error& e) {
    cli::print_error(e.what());
    return exit_status_for(e.code());
  } catch (const std::exception& e) {
    cli::print_error(fmt::format("internal error: {}", e.what()));
    return 70;
  }
  return exit_status;
}
