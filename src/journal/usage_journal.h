// UsageJournal: where a backend records every lease's start and end, behind one interface.
//
// The local backend's journal is a directory of append-only files (journal/file_journal.h);
// the Redis backend's is a capped stream in the pool (redis/redis_journal.h). Writing never
// throws and never blocks a lease for long: a journal that cannot be written (absent, read-only,
// a full disk, a server gone) costs the record, and the process says so once on stderr.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "gpulock/usage.hpp"

namespace gpulock {

// Where a reader of the journal stopped, for UsageJournal::read_appended().
struct JournalCursor {
  // Local journal files by (device, inode), so a rotated file (renamed, never rewritten) keeps
  // its place: the bytes of whole lines already read. Files gone from the directory are dropped.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> offsets;
};

class UsageJournal {
 public:
  virtual ~UsageJournal() = default;

  virtual void append(const JournalRecord& record) noexcept = 0;
  // Every record kept, damaged ones skipped with a warning each. Throws Error(kEnvironment)
  // only where the backend cannot be asked at all (Redis unreachable).
  virtual JournalContents read() = 0;
  // The records appended since the last call with `cursor` (all the first time), in time order.
  // Sets `whole` where it returned every record kept instead, as this default does (the Redis
  // stream is capped, so that costs no more than its cap): the reader then counts afresh.
  virtual JournalContents read_appended(JournalCursor& cursor, bool& whole) {
    (void)cursor;
    whole = true;
    return read();
  }
  // In a forked child whose descriptors were closed wholesale (the detached holder): forget
  // this process's copies without closing them (their numbers may be reused); reopened on use.
  virtual void forget_descriptors() noexcept {}
  // Where the records go, for people ("/var/lib/gpulock/journal", "redis stream KEY").
  virtual std::string location() const = 0;
  // Makes the files that are full read-only for good (`gpulock journal seal`, journal_seal.h).
  // Throws Error(kEnvironment) where the journal keeps no files: off, or kept in the pool.
  virtual JournalSealReport seal();
};

// A journal that records nothing (journal_dir = "off").
class DisabledJournal final : public UsageJournal {
 public:
  void append(const JournalRecord&) noexcept override {}
  JournalContents read() override {
    JournalContents none;
    none.available = false;
    none.location = "off";
    return none;
  }
  std::string location() const override { return "off"; }
  JournalSealReport seal() override;
};

}  // namespace gpulock
