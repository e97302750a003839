// QueueDirectory: the machine's queue of waiting requests, one ticket file per waiter.
//
// <lock dir>/queue holds, for each waiting request, "<id>.ticket" (its request as JSON, locked
// with an OFD lock by the waiting process for as long as it waits), "<id>.wake" (a FIFO the
// waiter reads, so that any process can wake exactly that waiter by writing a byte), and a slot
// in the shared index (queue_index.h), which planners read instead of every ticket. A ticket
// whose lock is not held belongs to a waiter that died, SIGKILL included: it no longer counts;
// its slot is cleared by whoever finds it dead, and its files by a sweep of its user's (or
// root's) processes.
// The directory is sticky and world-writable like the lock directory; every open is relative to
// its descriptor, with O_NOFOLLOW, and checks the file type, so planted files are ignored.
#pragma once

#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "local/lock_directory.h"
#include "local/queue_index.h"
#include "queue/ticket.h"
#include "util/fd.h"

namespace gpulock {

// What a byte written to a waiter's wake FIFO asks of it.
enum class WakeReason : char {
  kPlan = 1,        // plan the queue again (it may be served)
  kDispatcher = 2,  // it is one of the three oldest now: follow releases (no plan needed)
  // It is the oldest waiter now (the oldest was served): act on releases at once, not after
  // the backups' delay. Versions before this reason plan on it, as on any byte but 2.
  kOldest = 3,
};

// This process's registration in the queue. Destroying it leaves the queue (the files go).
class OwnTicket {
 public:
  OwnTicket() = default;
  OwnTicket(OwnTicket&&) noexcept = default;
  OwnTicket& operator=(OwnTicket&& other) noexcept;
  OwnTicket(const OwnTicket&) = delete;
  OwnTicket& operator=(const OwnTicket&) = delete;
  ~OwnTicket() { leave(); }

  explicit operator bool() const { return ticket_fd_.valid(); }
  const Ticket& ticket() const { return ticket_; }
  // Readable when someone woke this waiter; drain_wakeups() empties it.
  int wake_fd() const { return wake_fd_.get(); }
  void drain_wakeups() const;
  // Clears its index slot, removes the files and closes them (which tells whoever watches
  // this ticket, and the dispatchers). In a child forked without exec it only forgets them: the
  // ticket is the parent's, and fork closed the child's copies (so that the child does not keep it
  // alive).
  void leave();

 private:
  friend class QueueDirectory;
  int dir_fd_ = -1;
  pid_t owner_pid_ = 0;
  const QueueIndex* index_ = nullptr;
  std::uint32_t slot_ = 0;
  Ticket ticket_;
  UniqueFd ticket_fd_;
  UniqueFd wake_fd_;
  // Open on the lock directory's departures file while waiting: its close tells the dispatchers
  // that this waiter left (LockDirectory::kDeparturesName). Numbered below the ticket's
  // descriptor, so that a dying waiter's ticket is unlocked before the close is announced: a
  // dying process's descriptors are taken in ascending order, but the closes themselves run
  // last-taken first (deferred task work).
  UniqueFd departure_fd_;
};

// The ticket an index entry stands for, with only what the index keeps (see read_ticket()).
Ticket ticket_of(const IndexEntry& entry);

class QueueDirectory {
 public:
  // Opens the queue directory inside the lock directory, creating it (mode 1777) if missing
  // and `create` is set; else nullptr while it does not exist (nobody has waited yet). Throws
  // Error(kEnvironment) when it cannot be created or used.
  static std::unique_ptr<QueueDirectory> open(const LockDirectory& locks, bool create);
  ~QueueDirectory();
  QueueDirectory(const QueueDirectory&) = delete;
  QueueDirectory& operator=(const QueueDirectory&) = delete;

  const std::filesystem::path& path() const { return dir_.path(); }
  int fd() const { return dir_.fd(); }

  struct Listing {
    // From list(): the tickets of waiting processes, by seq.
    std::vector<Ticket> live;
    // From list_index(): the waiting requests as the index has them, by seq (their tickets'
    // details come from read_ticket() when a plan reaches them).
    std::vector<IndexEntry> index;
    QueueIndex::Contents contents;  // from list_index(): the index as read
    std::uint64_t highest_seq = 0;  // among every readable ticket, live or not
    // When each user with a live ticket was last given GPUs (mark_served), in ns since the
    // epoch; 0 if never. Fair share breaks ties by it, so users take turns.
    std::map<uid_t, std::int64_t> last_served;
    std::vector<std::string> warnings;
  };
  // Reads the queue. With remove_dead, also removes dead waiters' files where this process may
  // (its own user's; everyone's as root). REQUIRES for remove_dead: the acquire mutex is held.
  Listing list(bool remove_dead) const;

  // The queue as its index has it, without opening any ticket: what planning needs.
  // REQUIRES: the acquire mutex is held.
  Listing list_index() const;

  // Registers a waiter; its seq is the next one of `listing` (from list_index()). REQUIRES: the
  // acquire mutex is held (so nobody sees a ticket before it is locked and written). Throws
  // Error(kEnvironment) when the files cannot be created or written (e.g. a full disk).
  OwnTicket enter(Ticket ticket, const Listing& listing) const;
  // The same, reading the index first.
  OwnTicket enter(const Ticket& ticket) const { return enter(ticket, list_index()); }

  // The ticket of an index entry, if it is valid (its file is a regular file owned by the
  // entry's uid, and says what the entry says) and live (its waiter holds it). Read once and
  // cached; the liveness is checked at every call (one fcntl).
  std::optional<Ticket> read_ticket(const IndexEntry& entry) const;

  // Clears the slot of an entry whose ticket is not live, and removes its files where this
  // process may (its own user's; everyone's as root); false if it is live after all, or if its
  // process lives (it is leaving, and clears its slot itself).
  // REQUIRES: the acquire mutex is held.
  bool remove_dead(const IndexEntry& entry) const;

  // Wakes the waiter that registered next after `seq` (the one that watches that waiter's
  // process), as the index is now.
  void wake_successor(std::uint64_t seq) const;
  // The id of the waiter in `listing` that registered next after `seq`, if any.
  static std::optional<std::string> successor(std::uint64_t seq, const Listing& listing);

  // Records that user `uid` (this process's) was given GPUs now ("served-<uid>", whose mtime
  // says when).
  void mark_served(uid_t uid) const;

  // True while the waiter of that ticket waits (its file exists and is locked).
  bool is_live(const std::string& ticket_id) const;

  // Wakes the waiter of that ticket; does nothing if it is gone.
  void wake(const std::string& ticket_id, WakeReason reason = WakeReason::kPlan) const;

  // Makes the directory root-owned (for `gpulock init`); removes every dead ticket and slot.
  // REQUIRES: the acquire mutex is held, or nobody else plans (boot).
  void prepare() const;

 private:
  QueueDirectory(LockDirectory dir, LockDirectory locks)
      : dir_(std::move(dir)), locks_(std::move(locks)) {}
  // The index, opened (and created) on first use: views that only list never create it.
  QueueIndex& index() const;
  // A ticket read before; tickets never change once written, so only new files are parsed.
  std::optional<Ticket> cached_ticket(const std::string& id, int fd, const struct stat& st) const;
  // When each of these users was last given GPUs (served-<uid>), in ns; 0 if never.
  void read_last_served(Listing& listing) const;

  LockDirectory dir_;
  LockDirectory locks_;  // the lock directory it is in, for the departures file
  mutable std::mutex index_mutex_;
  mutable std::unique_ptr<QueueIndex> index_;
  struct OpenTicket {
    UniqueFd fd;
    Ticket ticket;
    UsabilityHint hint;  // the ticket's, against which every reading checks its slot's
  };
  mutable std::mutex open_tickets_mutex_;
  mutable std::map<std::string, OpenTicket, std::less<>> open_tickets_;
  struct CachedTicket {
    ino_t inode = 0;
    std::optional<Ticket> ticket;
  };
  mutable std::mutex stream_mutex_;
  mutable DIR* stream_ = nullptr;
  mutable std::mutex cache_mutex_;
  mutable std::map<std::string, CachedTicket> cache_;
};

}  // namespace gpulock
