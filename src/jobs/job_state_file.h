// A job's state record (the `state` file of its directory): written in place, never allocated.
//
// The supervisor records each step of a job (waiting, running, its end) while its command may be
// filling the disk with output. A record replaced by write-and-rename needs new blocks each time,
// so a full disk would keep the end from being written and the job would read as lost. This
// file is made at submission at its full size, two slots of kJobStateSlotBytes, each holding one
// copy of the record with a sequence number and a checksum. A write overwrites the older slot in
// place (no new block on tmpfs, ext4 or xfs; a copy-on-write file system may still refuse it),
// and a reader takes the newest slot whose checksum holds, so a write torn by a crash leaves the
// previous record readable.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gpulock {

inline constexpr std::size_t kJobStateSlotBytes = 4096;
// The longest record text a slot holds.
inline constexpr std::size_t kMaxJobStateText = kJobStateSlotBytes - 64;

inline constexpr const char* kJobStateFile = "state";

// Makes the file in the directory `dir_fd` (it must not exist), mode 0644, holding `text`.
// Throws Error(kEnvironment) where it cannot (a full disk: nothing is left behind).
void create_job_state(int dir_fd, std::string_view text);
// Replaces the record: overwrites the older slot. Throws Error(kEnvironment) where the file
// cannot be written, Error(kInvalidArgument) for a text over kMaxJobStateText.
// REQUIRES: one writer at a time (the job's supervisor, or `submit` before it starts).
void write_job_state(int dir_fd, std::string_view text);
// The newest whole record. Throws Error(kEnvironment) where there is none (no file, not a
// regular file, no slot whose checksum holds).
std::string read_job_state(int dir_fd);

}  // namespace gpulock
