// `gpulock run [selection] [waiting] -- CMD [ARGS…]`: lease GPUs, run a command on them.
#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {

void add_run_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("run", "Lease GPUs, then run a command with them visible");
  auto options = std::make_shared<RequestOptions>();
  auto argv = std::make_shared<std::vector<std::string>>();
  auto on_loss = std::make_shared<std::string>("warn");
  options->add_to(*command);
  command
      ->add_option("--on-lease-loss", *on_loss,
                   "Redis backend: what to do if the lease is lost (not renewable for its TTL): "
                   "warn, or kill the command (SIGTERM, then SIGKILL after 10 s)")
      ->check(CLI::IsMember({"warn", "kill"}))
      ->capture_default_str();
  auto on_over_memory = std::make_shared<std::string>();
  command
      ->add_option("--on-over-memory", *on_over_memory,
                   "Shared leases (--mem): when the command's processes use more GPU memory than "
                   "reserved: warn, or term (SIGTERM, then SIGKILL after 10 s); default: neither")
      ->check(CLI::IsMember({"warn", "term"}));
  command->add_option("command", *argv, "The command and its arguments (after --)")->required();
  command->footer(
      "The command gets CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER=PCI_BUS_ID, GPULOCK_LEASE_ID and\n"
      "GPULOCK_GPUS (on Redis also GPULOCK_FENCING_TOKEN and GPULOCK_LEASE_HOST). With lock files "
      "the\n"
      "lease lasts while any process of the command holds it, even if gpulock itself is killed;\n"
      "on Redis gpulock renews it while the command runs. gpulock exits with the command's\n"
      "status (128+N if signal N killed it).");
  command->callback([options, argv, on_loss, on_over_memory, exit_status] {
    if (!on_over_memory->empty() && options->mem.empty() && options->slots == 0)
      throw Error(ErrorCode::kInvalidArgument,
                  "--on-over-memory watches a shared lease: use it with --mem or --slots");
    GpuPool pool = open_pool(options->backend);
    Lease lease = acquire_for_cli(pool, *options, fmt::format("{}", fmt::join(*argv, " ")));
    std::function<bool()> check;
    if (!on_over_memory->empty())
      check = over_memory_check(
          pool, lease,
          *on_over_memory == "term" ? OverMemoryAction::kTerm : OverMemoryAction::kWarn);
    *exit_status =
        run_command(lease, *argv, options->visible_format(),
                    *on_loss == "kill" ? LeaseLossAction::kKill : LeaseLossAction::kWarn, check);
  });
}

}  // namespace gpulock::cli
