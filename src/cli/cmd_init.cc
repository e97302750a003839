// `gpulock init`: make the lock directory and every GPU's lock file ready at boot (root-owned
// when run as root), so that no user owns, and can delete, a lock file; as root, seal the usage
// journal's files append-only; and make the job store (gpulock submit), root-owned as root.
#include <pwd.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

void prepare_job_store() {
  // The job store: made here by root, no user owns it (whoever makes it can remove every
  // job in it). A store that cannot be used is a warning: the leases work without it.
  try {
    const JobStore store = open_job_store();
    struct stat st {};
    if (::stat(store.root().c_str(), &st) != 0)
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("the job store {}: {}", store.root().string(), ::strerror(errno)));
    if (::geteuid() == 0 && st.st_uid != 0) {
      const passwd* owner = ::getpwuid(st.st_uid);
      fmt::print(stderr,
                 "gpulock: warning: the job store {} belongs to {}, who can remove every "
                 "user's jobs: chown root {}\n",
                 store.root().string(),
                 owner ? std::string(owner->pw_name) : "uid " + std::to_string(st.st_uid),
                 store.root().string());
    }
    fmt::print("job store: {}{}\n", store.root().string(), st.st_uid == 0 ? ", root-owned" : "");
  } catch (const Error& error) {
    fmt::print(stderr, "gpulock: warning: {}\n", error.what());
  }
}

}  // namespace

void add_init_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "init", "Create the lock directory and every GPU's lock file (as root: root-owned)");
  command->footer(
      "Run as root at boot (see contrib/) so that no user owns, and can delete, lock files.");
  command->callback([exit_status] {
    GpuPool pool = GpuPool::open();
    if (pool.lock_dir().empty()) {
      // Jobs run on the host that submits them, from a local store, whatever the backend.
      fmt::print("the {} backend keeps no lock files: nothing to prepare for leases\n",
                 pool.backend_name());
      prepare_job_store();
      *exit_status = 0;
      return;
    }
    pool.prepare();
    fmt::print("{}: lock files ready for {} GPUs{}\n", pool.lock_dir().string(),
               pool.devices().size(), ::geteuid() == 0 ? ", root-owned" : "");
    const std::string journal = pool.journal_location();
    if (::geteuid() == 0 && journal != "off") {
      // Root seals what users wrote before (`gpulock journal seal` keeps it so); a seal that
      // fails costs only the guarantee, never the leases: warnings.
      try {
        const JournalSealReport report = pool.seal_journal();
        print_seal_report(report);
        fmt::print("usage journal: {}{}\n", journal,
                   report.supported ? ", files sealed append-only" : "");
      } catch (const Error& error) {
        fmt::print(stderr, "gpulock: warning: {}\n", error.what());
        fmt::print("usage journal: {}\n", journal);
      }
    } else {
      fmt::print("usage journal: {}\n", journal);
    }
    prepare_job_store();
    *exit_status = 0;
  });
}

}  // namespace gpulock::cli
