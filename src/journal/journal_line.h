// One usage-journal record as one line of text: "<crc32 as 8 hex digits> <JSON>\n".
//
// The checksum covers the JSON, so a line torn by a crash, cut by a full disk or edited by hand
// is recognised and skipped. A line is at most kMaxJournalLine bytes, so that one write() of it
// to a file opened O_APPEND lands whole, never interleaved with another process's line; long
// commands and labels are cut to fit. The same JSON text is the payload of a Redis stream entry.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "gpulock/usage.hpp"

namespace gpulock {

inline constexpr std::size_t kMaxJournalLine = 4000;

// The record's JSON (no checksum, no newline), under kMaxJournalLine - 10 bytes.
std::string journal_record_json(const JournalRecord& record);
// The checksummed line, newline included.
std::string journal_line(const JournalRecord& record);

// A record from its JSON; nullopt (with `why` set) for anything malformed. Untrusted input:
// every field is checked and every string bounded.
std::optional<JournalRecord> parse_journal_record_json(std::string_view json, std::string* why);
// A record from a line (without its newline); nullopt with `why` when the checksum or the
// JSON is wrong.
std::optional<JournalRecord> parse_journal_line(std::string_view line, std::string* why);

}  // namespace gpulock
