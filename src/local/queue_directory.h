// QueueDirectory: the machine's queue of waiting requests, one ticket file per waiter.
//
// <lock dir>/queue holds, for each waiting request, "<id>.ticket" (its request as JSON, locked
// with an OFD lock by the waiting process for as long as it waits) and "<id>.wake" (a FIFO the
// waiter reads, so that any process can wake exactly that waiter by writing a byte). A ticket
// whose lock is not held belongs to a waiter that died, SIGKILL included: it no longer counts,
// and its files are removed by the next of its user's processes (or root) that plans the queue.
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
#include "queue/ticket.h"
#include "util/fd.h"

namespace gpulock {

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
  // Removes the files and closes them (which tells whoever watches this ticket).
  void leave();

 private:
  friend class QueueDirectory;
  int dir_fd_ = -1;
  Ticket ticket_;
  UniqueFd ticket_fd_;
  UniqueFd wake_fd_;
};

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
    std::vector<Ticket> live;       // tickets of waiting processes, by seq
    std::uint64_t highest_seq = 0;  // among every readable ticket, live or not
    // When each user with a live ticket was last given GPUs (mark_served), in ns since the
    // epoch; 0 if never. Fair share breaks ties by it, so users take turns.
    std::map<uid_t, std::int64_t> last_served;
    std::vector<std::string> warnings;
  };
  // Reads the queue. With remove_dead, also removes dead waiters' files where this process may
  // (its own user's; everyone's as root). REQUIRES for remove_dead: the acquire mutex is held.
  Listing list(bool remove_dead) const;

  // Registers a waiter. REQUIRES: the acquire mutex is held (so nobody sees a ticket before it
  // is locked and written) and ticket.seq is above every seq listed. Throws Error(kEnvironment)
  // when the files cannot be created or written (e.g. a full disk).
  OwnTicket enter(const Ticket& ticket) const;

  // Records that this process's user was given GPUs now ("served-<uid>", whose mtime says when).
  void mark_served() const;

  // True while the waiter of that ticket waits (its file exists and is locked).
  bool is_live(const std::string& ticket_id) const;

  // Wakes the waiter of that ticket; does nothing if it is gone.
  void wake(const std::string& ticket_id) const;

  // A path under which inotify can watch that ticket (through this directory's descriptor).
  std::string watch_path(const std::string& ticket_id) const;

  // Makes the directory root-owned (for `gpulock init`); removes every dead ticket.
  void prepare() const;

 private:
  explicit QueueDirectory(LockDirectory dir) : dir_(std::move(dir)) {}
  // A ticket read before; tickets never change once written, so only new files are parsed.
  std::optional<Ticket> cached_ticket(const std::string& id, int fd, const struct stat& st) const;

  LockDirectory dir_;
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
