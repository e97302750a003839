// LocalBackend::doctor(): the checks of the local (file) backend's set-up.
#include <fcntl.h>
#include <sys/stat.h>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "journal/journal_seal.h"
#include "local/local_backend.h"

namespace gpulock {

DoctorCheck LocalBackend::journal_check() const {
  using Level = DoctorCheck::Level;
  if (!file_journal_)
    return {Level::kOk, "usage journal", "off (journal_dir or GPULOCK_JOURNAL_DIR)"};
  const std::string where = file_journal_->location();
  struct stat st {};
  if (::lstat(where.c_str(), &st) != 0)
    return {Level::kWarning, "usage journal",
            fmt::format("{} does not exist yet: leases are recorded once a gpulock can make it; "
                        "run `gpulock init` as root to make it root-owned",
                        where)};
  if (!S_ISDIR(st.st_mode))
    return {Level::kWarning, "usage journal",
            fmt::format("{} is not a directory: leases are not recorded", where)};
  if ((st.st_mode & 01777) != 01777)
    return {Level::kWarning, "usage journal",
            fmt::format("{} has mode {:o}, not 1777: some users' leases may not be recorded", where,
                        st.st_mode & 07777)};
  if (st.st_uid != 0)
    return {Level::kWarning, "usage journal",
            fmt::format("{} is owned by uid {}, who may delete others' records; run `gpulock "
                        "init` as root (docs/operations.md)",
                        where, st.st_uid)};
  return {Level::kOk, "usage journal", where};
}

DoctorCheck LocalBackend::departures_check() const {
  using Level = DoctorCheck::Level;
  const char* const what = "queue departures";
  struct stat st {};
  if (::fstatat(dir_.fd(), LockDirectory::kDeparturesName, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return {Level::kOk, what, "announced (the file is made at the first wait)"};
  try {
    dir_.open_shared_file(LockDirectory::kDeparturesName);
  } catch (const Error& error) {
    return {Level::kWarning, what,
            fmt::format("waiters that leave are not announced to the queue's dispatchers (they "
                        "notice them later, through the waiter behind or a periodic re-check): "
                        "{}",
                        error.what())};
  }
  return {Level::kOk, what, "announced"};
}

std::vector<DoctorCheck> LocalBackend::doctor() {
  using Level = DoctorCheck::Level;
  std::vector<DoctorCheck> checks;
  checks.push_back({Level::kOk, "backend",
                    fmt::format("file: lock files in {} (GPULOCK_BACKEND or the config's "
                                "`backend` selects Redis)",
                                dir_.path().string())});
  for (const auto& warning : dir_.warnings())
    checks.push_back({Level::kWarning, "lock directory", warning});
  for (const auto& advice : dir_.advice())
    checks.push_back({Level::kWarning, "lock directory", advice});
  try {
    const auto devices = source_->devices();
    // A simulated source's description counts its GPUs already ("4 simulated GPUs").
    checks.push_back({Level::kOk, "devices",
                      source_->simulated()
                          ? source_->description() + " (no real GPU)"
                          : fmt::format("{}: {} GPU{}", source_->description(), devices.size(),
                                        devices.size() == 1 ? "" : "s")});
  } catch (const Error& error) {
    checks.push_back({Level::kFailed, "devices", error.what()});
  }
  checks.push_back({Level::kOk, "config",
                    config_.source.empty() ? "no config file (defaults)" : config_.source});
  checks.push_back(departures_check());
  checks.push_back(journal_check());
  if (file_journal_ && checks.back().level == Level::kOk)
    if (auto seal = journal_seal_check(file_journal_->location())) checks.push_back(*seal);
  return checks;
}

}  // namespace gpulock
