// HolderRecord: who holds a GPU lease, stored inside the GPU's lock file for display.
//
// The record is informational only: the kernel lock is the truth. Anyone who can open the lock
// file can write it, so a record read back is untrusted: parse_holder_record() validates every
// field, bounds every string and returns nullopt for anything malformed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "process/process_identity.h"

namespace gpulock {

// How the lease is held, which decides who may end it.
enum class HolderKind {
  kProcess,   // a process holds it in memory (library, Python): ends with that process
  kRun,       // `gpulock run`: ends when the command's process tree has closed the locks
  kDetached,  // `gpulock acquire`: a detached holder; `gpulock release` ends it
};
const char* holder_kind_name(HolderKind kind) noexcept;

struct HolderRecord {
  std::string lease_id;
  uid_t uid = 0;
  std::string user;
  std::string host;
  std::string boot_id;
  HolderKind kind = HolderKind::kProcess;
  ProcessId holder;  // the process holding the lock descriptors
  std::vector<ProcessId>
      members;  // processes whose trees the lease covers (the command, --for-pid)
  std::string command;
  std::string label;
  double started_at = 0;          // seconds since the Unix epoch
  std::vector<std::string> gpus;  // UUIDs of every GPU in the lease
  // A shared lease: the memory it reserves on each of its GPUs (a multiple of the 256 MiB
  // unit); unset for an exclusive lease.
  std::optional<std::uint64_t> memory_bytes;
  // A detached lease held for a session (`gpulock acquire` without --for-pid): the session's id.
  // The lease covers every process of that session; 0 for other leases.
  pid_t session = 0;
};

// Fixed size of a record on disk: each write replaces the whole record in one pwrite.
inline constexpr std::size_t kHolderRecordSize = 4096;

// JSON padded with spaces to kHolderRecordSize; long command lines and labels are cut to fit.
std::string serialize_holder_record(const HolderRecord& record);
// The same record unpadded (under kHolderRecordSize bytes), where no fixed size is needed.
std::string holder_record_json(const HolderRecord& record);

std::optional<HolderRecord> parse_holder_record(std::string_view bytes);

// For tests: the same reading through the full JSON parser alone, and whether the fast reader of
// records in the form gpulock writes them accepts `bytes` (parse_holder_record() then uses it).
std::optional<HolderRecord> parse_holder_record_with_full_parser(std::string_view bytes);
bool holder_record_is_canonical(std::string_view bytes);

}  // namespace gpulock
