// `gpulock run [selection] [waiting] -- CMD [ARGS…]`: lease GPUs, run a command on them.
#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {

void add_run_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("run", "Lease GPUs, then run a command with them visible");
  auto options = std::make_shared<RequestOptions>();
  auto argv = std::make_shared<std::vector<std::string>>();
  options->add_to(*command);
  command->add_option("command", *argv, "The command and its arguments (after --)")->required();
  command->footer(
      "The command gets CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER=PCI_BUS_ID, GPULOCK_LEASE_ID and\n"
      "GPULOCK_GPUS. The lease lasts while any process of the command holds it, even if gpulock\n"
      "itself is killed. gpulock exits with the command's status (128+N if signal N killed it).");
  command->callback([options, argv, exit_status] {
    GpuPool pool = GpuPool::open();
    Lease lease = acquire_for_cli(pool, *options, fmt::format("{}", fmt::join(*argv, " ")));
    *exit_status = run_command(lease, *argv, options->visible_format());
  });
}

}  // namespace gpulock::cli
