// `gpulock release LEASE_ID` or `gpulock release --gpus LIST`: end leases taken with
// `gpulock acquire` (own leases; root: any), named by id or by the GPUs they hold (for scripts
// that kept only `--print-ids`' output).
#include "cli.h"

namespace gpulock::cli {

void add_release_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "release", "End a lease taken with `gpulock acquire`, by its id or by its GPUs");
  auto lease_id = std::make_shared<std::string>();
  auto gpus = std::make_shared<std::string>();
  auto backend = std::make_shared<std::string>();
  auto* id_option =
      command->add_option("lease_id", *lease_id, "The lease, as `gpulock status` shows it");
  auto* gpus_option = command->add_option(
      "--gpus", *gpus,
      "The leases holding these GPUs instead: indices (as acquire printed them) or UUIDs");
  id_option->excludes(gpus_option);
  add_backend_option(*command, *backend);
  command->callback([lease_id, gpus, backend, exit_status] {
    if (lease_id->empty() && gpus->empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "release: name the lease (LEASE_ID, as `gpulock status` shows it) or its "
                  "GPUs (--gpus LIST)");
    GpuPool pool = open_pool(*backend);
    for (const std::string& id : gpus->empty() ? std::vector<std::string>{*lease_id}
                                               : pool.leases_holding(parse_gpu_list(*gpus)))
      pool.release(id);
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
