// UsageJournal: where a backend records every lease's start and end, behind one interface.
//
// The local backend's journal is a directory of append-only files (journal/file_journal.h);
// the Redis backend's is a capped stream in the pool (redis/redis_journal.h). Writing never
// throws and never blocks a lease for long: a journal that cannot be written (absent, read-only,
// a full disk, a server gone) costs the record, and the process says so once on stderr.
#pragma once

#include <string>

#include "gpulock/usage.hpp"

namespace gpulock {

class UsageJournal {
 public:
  virtual ~UsageJournal() = default;

  virtual void append(const JournalRecord& record) noexcept = 0;
  // Every record kept, damaged ones skipped with a warning each. Throws Error(kEnvironment)
  // only where the backend cannot be asked at all (Redis unreachable).
  virtual JournalContents read() = 0;
  // In a forked child whose descriptors were closed wholesale (the detached holder): forget
  // this process's copies without closing them (their numbers may be reused); reopened on use.
  virtual void forget_descriptors() noexcept {}
  // Where the records go, for people ("/var/lib/gpulock/journal", "redis stream KEY").
  virtual std::string location() const = 0;
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
};

}  // namespace gpulock
