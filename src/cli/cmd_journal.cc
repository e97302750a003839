// `gpulock journal seal`: as root (from contrib/systemd/gpulock-journal.timer), seals the usage
// journal's files append-only and rotates the full ones (docs/operations.md).
#include <cstdio>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {

bool print_seal_report(const JournalSealReport& report) {
  for (const auto& rotated : report.rotated) fmt::print("rotated {}\n", rotated);
  for (const auto& name : report.sealed) fmt::print("sealed {}\n", name);
  for (const auto& problem : report.problems)
    fmt::print(stderr, "gpulock: warning: usage journal {}/{}\n", report.location, problem);
  if (!report.supported)
    fmt::print(stderr,
               "gpulock: warning: usage journal {}: its file system cannot seal files "
               "append-only ({}): leases are recorded, but each user can rewrite their own "
               "records\n",
               report.location, report.unsupported_reason);
  return report.supported && report.problems.empty();
}

void add_journal_command(CLI::App& app, int* exit_status) {
  auto* journal = app.add_subcommand("journal", "Look after the local usage journal (as root)");
  journal->require_subcommand(1);
  auto* seal = journal->add_subcommand(
      "seal", "Seal the usage journal's files append-only and rotate the full ones (as root)");
  seal->footer(
      "Sealed files can only be appended to, by their owners included; run it as root from a "
      "timer (contrib/systemd/gpulock-journal.timer). Exit 69 if a file could not be sealed.");
  seal->callback([exit_status] {
    GpuPool pool = GpuPool::open();
    const JournalSealReport report = pool.seal_journal();
    const bool clean = print_seal_report(report);
    fmt::print("{}: {} file{} sealed now, {} already sealed, {} rotated\n", report.location,
               report.sealed.size(), report.sealed.size() == 1 ? "" : "s", report.already_sealed,
               report.rotated.size());
    *exit_status = clean ? 0 : 69;
  });
}

}  // namespace gpulock::cli
