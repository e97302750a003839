// FileJournal: the local usage journal, a directory of append-only files of checksummed lines.
//
// Each user appends only to a file of their own, "usage-<uid>.log" (mode 0644), in a directory
// every user may create files in but nobody may delete or rename others' files from (mode 1777,
// made by `gpulock init`, root-owned when run as root). So no user can rewrite or remove another
// user's records; a user can falsify only their own (see docs/operations.md, "Usage journal").
//
// A record is one write() of one line to a descriptor opened O_APPEND: concurrent appends of
// several processes never interleave. Past max_bytes the writer renames its file to
// "usage-<uid>-<time>.log" under an flock() of the file, so that two rotating processes of one
// user agree; a process still holding the old descriptor appends to the renamed file, which is
// read like the current one, and reopens on its next rotation check. Nothing is ever deleted.
//
// Where root has sealed the files append-only (journal/journal_seal.h), nobody can truncate,
// rewrite, rename or delete them, their owner included; the owner's rename then fails, and the
// file grows until root's `gpulock journal seal` rotates it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "journal/usage_journal.h"
#include "util/fd.h"

namespace gpulock {

inline constexpr std::uint64_t kDefaultJournalFileBytes = 64ull << 20;

class FileJournal final : public UsageJournal {
 public:
  // `directory` is made (mode 1777) when missing if its parent lets us. One that is missing and
  // cannot be made turns the journal off without a warning: it was not set up on this machine
  // (`gpulock init` makes it; `gpulock usage` and `gpulock log` say it is missing). One that
  // exists but cannot be written warns once per process.
  FileJournal(std::filesystem::path directory, std::uint64_t max_file_bytes);

  void append(const JournalRecord& record) noexcept override;
  JournalContents read() override;
  // Reads each file from where `cursor` left it, whole lines only (a line still being written
  // waits for the next call): the cost is what was appended, not the journal's size.
  JournalContents read_appended(JournalCursor& cursor, bool& whole) override;
  std::string location() const override { return directory_.string(); }
  JournalSealReport seal() override;
  void forget_descriptors() noexcept override;

  // Makes the directory (mode 1777, root-owned when run as root) for `gpulock init`. Throws
  // Error(kEnvironment) when it cannot.
  void prepare() const;

 private:
  // Opens our own file (creating it), or says why not. REQUIRES: mutex_ held.
  bool open_own_file(std::string& why);
  // Renames our file away when it is past max_file_bytes. REQUIRES: mutex_ held, file_ open.
  void rotate_if_full();
  void warn_once(const std::string& what) noexcept;
  // The directory, open, with its journal files' names in `names` (sorted); an invalid fd when
  // it cannot be read, `contents` then saying so (location, available, a warning).
  UniqueFd open_for_reading(JournalContents& contents, std::vector<std::string>& names) const;

  const std::filesystem::path directory_;
  const std::uint64_t max_file_bytes_;
  std::mutex mutex_;
  UniqueFd dir_fd_;
  UniqueFd file_;
  // Our file's size as last seen plus what we appended since; the real size (others append
  // too) is looked at when this passes the limit, and every kSizeCheckInterval appends.
  std::uint64_t size_estimate_ = 0;
  unsigned appends_since_check_ = 0;
  // Our file is full but sealed: root rotates it; look again only every kSizeCheckInterval.
  bool rotation_left_to_root_ = false;
  pid_t opened_by_ = 0;  // a forked child reopens (its own descriptor, its own offset checks)
  bool disabled_ = false;
  std::atomic<bool> warned_{false};
};

// "usage-<uid>.log" and the rotated "usage-<uid>-<time>-<id>.log": the names the journal reads.
bool is_journal_file_name(std::string_view name);
// The journal files' names in the open directory, sorted.
std::vector<std::string> journal_file_names(int dir_fd);

// Where the local journal lives: GPULOCK_JOURNAL_DIR, else the config's journal_dir, else
// /var/lib/gpulock/journal when the lock directory is a default one, else <lock dir>/journal.
// "off" (either way) turns the journal off.
std::string journal_directory(const std::string& configured, const std::filesystem::path& lock_dir,
                              bool lock_dir_is_default);

}  // namespace gpulock
