// `gpulock release LEASE_ID`: end a lease taken with `gpulock acquire` (own leases; root: any).
#include "cli.h"

namespace gpulock::cli {

void add_release_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("release", "End a lease taken with `gpulock acquire`");
  auto lease_id = std::make_shared<std::string>();
  auto backend = std::make_shared<std::string>();
  command->add_option("lease_id", *lease_id, "The lease, as `gpulock status` shows it")->required();
  add_backend_option(*command, *backend);
  command->callback([lease_id, backend, exit_status] {
    GpuPool pool = open_pool(*backend);
    pool.release(*lease_id);
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
