// `gpulock init`: make the lock directory and every GPU's lock file ready at boot (root-owned
// when run as root), so that no user owns, and can delete, a lock file.
#include <unistd.h>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {

void add_init_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "init", "Create the lock directory and every GPU's lock file (as root: root-owned)");
  command->footer(
      "Run as root at boot (see contrib/) so that no user owns, and can delete, lock files.");
  command->callback([exit_status] {
    GpuPool pool = GpuPool::open();
    if (pool.backend_name() != "file") {
      fmt::print("the {} backend keeps no lock files: nothing to prepare\n", pool.backend_name());
      *exit_status = 0;
      return;
    }
    pool.prepare();
    fmt::print("{}: lock files ready for {} GPUs{}\n", pool.lock_dir().string(),
               pool.devices().size(), ::geteuid() == 0 ? ", root-owned" : "");
    fmt::print("usage journal: {}\n", pool.journal_location());
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
