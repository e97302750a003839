// The queue directory: registering waiters, listing the live ones, waking one of them.
#include "local/queue_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "local/fork_guard.h"
#include "local/gpu_lock_file.h"
#include "process/process_identity.h"
#include "util/current_pid.h"
#include "util/fd.h"
#include "util/fork_gate.h"
#include "util/quiet_pipe_write.h"
#include "util/random_id.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

constexpr const char* kTicketSuffix = ".ticket";
constexpr const char* kWakeSuffix = ".wake";
constexpr mode_t kTicketMode = 0644;  // everyone reads the queue; only the waiter writes
constexpr mode_t kWakeMode = 0622;    // everyone may wake the waiter

std::string ticket_name(std::string_view id) {
  return std::string(id) + kTicketSuffix;
}
std::string wake_name(std::string_view id) {
  return std::string(id) + kWakeSuffix;
}

// The id in "<id><suffix>", or "" if the name is not of that form.
std::string id_of(const std::string& name, std::string_view suffix) {
  if (!name.ends_with(suffix)) return "";
  std::string id = name.substr(0, name.size() - suffix.size());
  return is_lease_id(id) ? id : "";
}

// The same open file, numbered above `floor` (dup'd if it is not).
UniqueFd above(UniqueFd fd, int floor) {
  if (!fd || fd.get() > floor) return fd;
  return UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, floor + 1));
}

// Keeps descriptors 0-2 free: a caller running with stdio closed would otherwise take a ticket
// for its standard output.
UniqueFd above_stdio(UniqueFd fd) {
  return above(std::move(fd), 2);
}

// The file's bytes, at most kMaxTicketSize + 1 (more means too big). `size_hint` (the size fstat
// gave) keeps the buffer small for the usual ticket of a few hundred bytes.
std::string read_bounded(int fd, off_t size_hint) {
  const std::size_t wanted = std::min<std::size_t>(
      static_cast<std::size_t>(std::max<off_t>(size_hint, 0)) + 1, kMaxTicketSize + 1);
  return read_prefix(fd, wanted);
}

}  // namespace

OwnTicket& OwnTicket::operator=(OwnTicket&& other) noexcept {
  if (this != &other) {
    leave();
    dir_fd_ = other.dir_fd_;
    owner_pid_ = other.owner_pid_;
    index_ = other.index_;
    slot_ = other.slot_;
    ticket_ = std::move(other.ticket_);
    ticket_fd_ = std::move(other.ticket_fd_);
    wake_fd_ = std::move(other.wake_fd_);
    departure_fd_ = std::move(other.departure_fd_);
  }
  return *this;
}

void OwnTicket::drain_wakeups() const {
  char buffer[256];
  while (wake_fd_ && ::read(wake_fd_.get(), buffer, sizeof buffer) > 0) {
  }
}

void OwnTicket::leave() {
  // (Also after enter() failed half way: then some descriptors are open, but no ticket is
  // registered.)
  if (!ticket_fd_ && !wake_fd_ && !departure_fd_) return;
  if (current_pid() != owner_pid_) {
    // A forked child's copy: the files are the parent's, and the descriptors were closed at the
    // fork (their numbers may be someone else's by now).
    ticket_fd_.release();
    wake_fd_.release();
    departure_fd_.release();
    return;
  }
  // The files first, the slot last: a SIGKILL between two of these steps leaves the slot, and
  // whoever next finds it dead removes what is left (remove_dead()). With the slot removed
  // first, a kill between the two unlinks left a file that only a sweep of the whole directory
  // found. Then close: whoever watches the ticket is told by the close, and by then the ticket
  // is gone from the listing.
  if (!ticket_.id.empty()) {
    ::unlinkat(dir_fd_, ticket_name(ticket_.id).c_str(), 0);
    ::unlinkat(dir_fd_, wake_name(ticket_.id).c_str(), 0);
  }
  if (index_) index_->remove(slot_, ticket_.seq);
  // Unguarded and closed in one step, so that no fork in between leaves a child a copy (one of
  // the departures file would keep the dispatchers from hearing that we left).
  const ForkGate gate;
  for (UniqueFd* fd : {&ticket_fd_, &wake_fd_, &departure_fd_}) {
    if (*fd) forget_in_forked_child(fd->get());
    fd->reset();  // the departures file last: the dispatchers plan without this waiter
  }
}

std::unique_ptr<QueueDirectory> QueueDirectory::open(const LockDirectory& locks, bool create) {
  const std::filesystem::path path = locks.path() / "queue";
  bool created = false;
  struct stat existing {};
  if (!create && ::fstatat(locks.fd(), "queue", &existing, AT_SYMLINK_NOFOLLOW) != 0 &&
      errno == ENOENT)
    return nullptr;
  if (::mkdirat(locks.fd(), "queue", 0700) == 0) {
    created = true;
  } else if (errno == ENOENT || errno == EACCES || errno == EPERM || errno == EROFS) {
    struct stat st {};
    if (::fstatat(locks.fd(), "queue", &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (!create) return nullptr;
      throw Error(ErrorCode::kEnvironment,
                  fmt::format("cannot create the queue directory {}: {}; the lock directory "
                              "must be writable by every user (mode 1777), or created by "
                              "`gpulock init`",
                              path.string(), std::strerror(errno)));
    }
  }
  if (created) {
    // Mode 1777 before anyone (LockDirectory::open included) looks at it.
    UniqueFd made(::openat(locks.fd(), "queue", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!made || ::fchmod(made.get(), 01777) != 0)
      throw Error(
          ErrorCode::kEnvironment,
          errno_message("cannot set mode 1777 on the queue directory " + path.string(), errno));
  }
  return std::unique_ptr<QueueDirectory>(
      new QueueDirectory(LockDirectory::open(path), locks.duplicate()));
}

QueueDirectory::~QueueDirectory() {
  if (stream_) ::closedir(stream_);
}

QueueDirectory::Listing QueueDirectory::list(bool remove_dead) const {
  Listing listing;
  const uid_t me = ::geteuid();
  std::vector<std::string> names;
  {
    // One directory stream, kept and rewound: opening one per listing costs more than the read.
    std::lock_guard<std::mutex> lock(stream_mutex_);
    if (!stream_) {
      const int dup_fd = ::fcntl(fd(), F_DUPFD_CLOEXEC, 3);
      stream_ = dup_fd >= 0 ? ::fdopendir(dup_fd) : nullptr;
      if (!stream_) {
        if (dup_fd >= 0) ::close(dup_fd);
        throw Error(ErrorCode::kEnvironment,
                    errno_message("cannot read the queue directory " + path().string(), errno));
      }
    }
    // The stream's descriptor shares its offset with ours: always start from the beginning.
    ::rewinddir(stream_);
    while (const dirent* entry = ::readdir(stream_)) {
      const std::string_view name = entry->d_name;
      if (name.ends_with(kTicketSuffix) || name.ends_with(kWakeSuffix)) names.emplace_back(name);
    }
  }

  std::set<std::string> ticket_ids;
  for (const auto& name : names) {
    const std::string id = id_of(name, kTicketSuffix);
    if (id.empty()) continue;
    ticket_ids.insert(id);
    UniqueFd file(
        ::openat(fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    if (!file) continue;  // gone meanwhile, or a planted symlink
    struct stat st {};
    if (::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const bool live = is_locked_elsewhere(file.get());
    const std::optional<Ticket> ticket = cached_ticket(id, file.get(), st);
    if (ticket && ticket->id == id)
      listing.highest_seq = std::max(listing.highest_seq, ticket->seq);
    if (live) {
      // A ticket counts for the user who owns the file, whatever it claims.
      if (ticket && ticket->id == id && ticket->uid == st.st_uid) {
        listing.live.push_back(*ticket);
      } else {
        listing.warnings.push_back(fmt::format(
            "ignoring queue entry {} (owner uid {}): it is not a valid ticket", name, st.st_uid));
      }
    } else if (remove_dead && (st.st_uid == me || me == 0)) {
      ::unlinkat(fd(), name.c_str(), 0);
      ::unlinkat(fd(), wake_name(id).c_str(), 0);
    }
  }
  if (remove_dead) {
    // A wake FIFO without a ticket: left by a waiter killed while it registered.
    for (const auto& name : names) {
      const std::string id = id_of(name, kWakeSuffix);
      if (id.empty() || ticket_ids.count(id) > 0) continue;
      struct stat st {};
      if (::fstatat(fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          (st.st_uid == me || me == 0))
        ::unlinkat(fd(), name.c_str(), 0);
    }
  }
  read_last_served(listing);
  std::sort(listing.live.begin(), listing.live.end(),
            [](const Ticket& a, const Ticket& b) { return a.seq < b.seq; });
  return listing;
}

std::optional<Ticket> QueueDirectory::cached_ticket(const std::string& id, int fd,
                                                    const struct stat& st) const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  auto it = cache_.find(id);
  // Cache only complete tickets: a ticket being registered is empty for a moment.
  if (it != cache_.end() && it->second.inode == st.st_ino && it->second.ticket)
    return it->second.ticket;
  std::optional<Ticket> ticket = parse_ticket(read_bounded(fd, st.st_size));
  if (cache_.size() > 4096) cache_.clear();
  cache_[id] = CachedTicket{st.st_ino, ticket};
  return ticket;
}

void QueueDirectory::mark_served(uid_t uid) const {
  const std::string name = "served-" + std::to_string(uid);
  if (::utimensat(fd(), name.c_str(), nullptr, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) return;
  UniqueFd file(::openat(fd(), name.c_str(),
                         O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644));
  // Best effort: without the file, this user only loses ties it might have won.
}

bool QueueDirectory::is_live(const std::string& ticket_id) const {
  UniqueFd file(::openat(fd(), ticket_name(ticket_id).c_str(),
                         O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  struct stat st {};
  return file && ::fstat(file.get(), &st) == 0 && S_ISREG(st.st_mode) &&
         is_locked_elsewhere(file.get());
}

OwnTicket QueueDirectory::enter(Ticket ticket, const Listing& listing) const {
  bool made_wake = false;
  bool made_ticket = false;
  const auto fail = [&](const std::string& what, int e) {
    // Remove only what this call made: the id could be someone else's.
    if (made_ticket) ::unlinkat(fd(), ticket_name(ticket.id).c_str(), 0);
    if (made_wake) ::unlinkat(fd(), wake_name(ticket.id).c_str(), 0);
    throw Error(ErrorCode::kEnvironment,
                fmt::format("cannot join the queue in {}: {}: {}{}", path().string(), what,
                            std::strerror(e), e == ENOSPC ? " (the disk is full)" : ""));
  };
  OwnTicket own;
  own.dir_fd_ = fd();
  own.owner_pid_ = current_pid();
  // Each descriptor below is guarded against forks (fork_guard.h) in the same step as it is
  // opened: a child forked in between would keep the ticket's lock, or the departures file, for
  // as long as it lives. (If this fails half way, `own` unguards and closes what it has.)
  std::optional<ForkGate> gate(std::in_place);
  // The departures file first, so that the ticket is numbered above it (OwnTicket's
  // departure_fd_). (Like every file the lock directory opens, it is numbered above stdio
  // already.)
  own.departure_fd_ = locks_.open_departures_beacon();
  if (own.departure_fd_) close_in_forked_child(own.departure_fd_.get());

  // The wake FIFO first: once the ticket is visible, others may wake us.
  const std::string wake = wake_name(ticket.id);
  if (::mkfifoat(fd(), wake.c_str(), 0600) != 0) fail("cannot create " + wake, errno);
  made_wake = true;
  // Read-write, so the FIFO always has a writer: it never reports end-of-file.
  own.wake_fd_ = above_stdio(UniqueFd(
      ::openat(fd(), wake.c_str(), O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY)));
  struct stat st {};
  if (own.wake_fd_) close_in_forked_child(own.wake_fd_.get());
  if (!own.wake_fd_ || ::fstat(own.wake_fd_.get(), &st) != 0 || !S_ISFIFO(st.st_mode))
    fail("cannot open " + wake, errno);
  if (::fchmod(own.wake_fd_.get(), kWakeMode) != 0) fail("cannot set the mode of " + wake, errno);

  const std::string name = ticket_name(ticket.id);
  own.ticket_fd_ =
      above(UniqueFd(::openat(fd(), name.c_str(),
                              O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600)),
            std::max(2, own.departure_fd_.get()));
  if (!own.ticket_fd_) fail("cannot create " + name, errno);
  close_in_forked_child(own.ticket_fd_.get());
  made_ticket = true;
  if (::fchmod(own.ticket_fd_.get(), kTicketMode) != 0)
    fail("cannot set the mode of " + name, errno);
  if (!try_lock_exclusive(own.ticket_fd_.get())) fail("cannot lock " + name, EAGAIN);
  gate.reset();
  // The slot first, for the seq; the ticket is locked already, so it counts as live from now.
  IndexEntry entry;
  entry.id = ticket.id;
  entry.uid = ticket.uid;
  entry.pid = ticket.process.pid;
  entry.pid_start = ticket.process.start_ticks;
  entry.priority = ticket.priority;
  entry.needed = ticket.needed;
  entry.named_gpus = ticket.named_gpus;
  entry.entered_over_limit = ticket.entered_over_limit;
  entry.shared_units = ticket.shared_units;
  entry.shared_slots = ticket.shared_slots;
  entry.stored_hint = UsabilityHint::of(ticket).stored();
  try {
    entry = index().add(entry, listing.contents);
  } catch (const Error&) {
    fail("cannot write the queue's index", ENOSPC);
  }
  ticket.seq = entry.seq;
  own.index_ = &index();
  own.slot_ = entry.slot;
  own.ticket_ = ticket;
  const std::string bytes = serialize_ticket(ticket);
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(own.ticket_fd_.get(), bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : ENOSPC;
      index().remove(entry.slot, entry.seq);
      fail("cannot write " + name, e);
    }
    written += static_cast<std::size_t>(n);
  }
  return own;
}

void QueueDirectory::wake(const std::string& ticket_id, WakeReason reason) const {
  // Non-blocking: with no reader (the waiter is gone) the open fails with ENXIO at once.
  UniqueFd fifo(::openat(fd(), wake_name(ticket_id).c_str(),
                         O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY));
  if (!fifo) return;
  struct stat st {};
  if (::fstat(fifo.get(), &st) != 0 || !S_ISFIFO(st.st_mode)) return;
  const char byte = static_cast<char>(reason);
  // Full: already woken. Gone since the open (it left): EPIPE, and no SIGPIPE to kill us.
  [[maybe_unused]] const ssize_t ignored = quiet_pipe_write(fifo.get(), &byte, 1);
}

QueueIndex& QueueDirectory::index() const {
  std::lock_guard<std::mutex> lock(index_mutex_);
  if (!index_) index_ = std::make_unique<QueueIndex>(dir_);
  return *index_;
}

Ticket ticket_of(const IndexEntry& e) {
  Ticket t;
  t.id = e.id;
  t.seq = e.seq;
  t.uid = e.uid;
  t.process.pid = e.pid;
  t.process.start_ticks = e.pid_start;
  t.priority = e.priority;
  t.needed = e.needed;
  t.named_gpus = e.named_gpus;
  t.entered_over_limit = e.entered_over_limit;
  t.shared_units = e.shared_units;
  t.shared_slots = e.shared_slots;
  return t;
}

QueueDirectory::Listing QueueDirectory::list_index() const {
  Listing listing;
  listing.contents = index().read();
  listing.highest_seq = listing.contents.next_seq - 1;
  listing.index = std::move(listing.contents.entries);  // enter() needs only the rest
  read_last_served(listing);
  return listing;
}

std::optional<Ticket> QueueDirectory::read_ticket(const IndexEntry& entry) const {
  std::lock_guard<std::mutex> lock(open_tickets_mutex_);
  auto it = open_tickets_.find(entry.id.view());
  if (it == open_tickets_.end() || it->second.ticket.seq != entry.seq) {
    UniqueFd file(::openat(fd(), ticket_name(entry.id).c_str(),
                           O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    struct stat st {};
    if (!file || ::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != entry.uid)
      return std::nullopt;
    std::optional<Ticket> ticket = parse_ticket(read_bounded(file.get(), st.st_size));
    if (!ticket || ticket->id != entry.id || ticket->seq != entry.seq || ticket->uid != entry.uid ||
        ticket->needed != entry.needed || ticket->priority != entry.priority ||
        ticket->named_gpus != entry.named_gpus ||
        ticket->entered_over_limit != entry.entered_over_limit ||
        ticket->shared_units != entry.shared_units || ticket->shared_slots != entry.shared_slots)
      return std::nullopt;
    // Bounded: the tickets a plan reads are those near the head of the queue.
    if (open_tickets_.size() >= 256) open_tickets_.clear();
    const UsabilityHint hint = UsabilityHint::of(*ticket);
    it = open_tickets_.insert_or_assign(entry.id, OpenTicket{std::move(file), *ticket, hint}).first;
  }
  // The slot's hint is checked at every reading: the slot may have been rewritten since.
  if (!entry.hint().admits(it->second.hint)) return std::nullopt;
  if (!is_locked_elsewhere(it->second.fd.get())) {
    open_tickets_.erase(it);
    return std::nullopt;
  }
  return it->second.ticket;
}

void QueueDirectory::wake_successor(std::uint64_t seq) const {
  Listing read;
  try {
    read.contents = index().read();
    read.index = std::move(read.contents.entries);
  } catch (const Error&) {
    return;  // best effort: the dispatchers hear the departure anyway
  }
  if (std::optional<std::string> next = successor(seq, read)) wake(*next);
}

std::optional<std::string> QueueDirectory::successor(std::uint64_t seq, const Listing& listing) {
  for (const IndexEntry& e : listing.index)
    if (e.seq > seq) return e.id;
  return std::nullopt;
}

bool QueueDirectory::remove_dead(const IndexEntry& entry) const {
  if (is_live(entry.id)) return false;
  // A waiter that is leaving unlinks its files before it empties its slot (OwnTicket::leave()):
  // it empties the slot itself. Emptying it here too could empty it after a newcomer took it.
  if (is_alive(ProcessId{entry.pid, entry.pid_start})) return false;
  // As in leave(), the files first and the slot last: this process, killed in between, leaves
  // the slot for the next one that finds it dead. Each file on its own: a waiter killed while
  // it left may have unlinked one of them.
  const uid_t me = ::geteuid();
  for (const std::string& name : {ticket_name(entry.id), wake_name(entry.id)}) {
    struct stat st {};
    if (::fstatat(fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        (st.st_uid == me || me == 0))
      ::unlinkat(fd(), name.c_str(), 0);
  }
  index().remove(entry.slot, entry.seq);
  return true;
}

void QueueDirectory::read_last_served(Listing& listing) const {
  // A queue of thousands is mostly one user's: the map is looked up when the user changes.
  const auto note = [&](uid_t uid) {
    if (listing.last_served.count(uid)) return;
    // Only the user's own file counts: anyone could plant one under another user's name.
    struct stat st {};
    const std::string name = "served-" + std::to_string(uid);
    const bool valid = ::fstatat(fd(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                       S_ISREG(st.st_mode) && st.st_uid == uid;
    listing.last_served[uid] = valid ? modified_unix_ns(st) : 0;
  };
  // From the index (list_index) or from the tickets (list); a queue of thousands is mostly one
  // user's, so the map is looked at when the user changes.
  for (std::size_t i = 0; i < listing.index.size(); ++i)
    if (i == 0 || listing.index[i].uid != listing.index[i - 1].uid) note(listing.index[i].uid);
  for (std::size_t i = 0; i < listing.live.size(); ++i)
    if (i == 0 || listing.live[i].uid != listing.live[i - 1].uid) note(listing.live[i].uid);
}

void QueueDirectory::prepare() const {
  if (::geteuid() == 0 && (::fchown(fd(), 0, 0) != 0 || ::fchmod(fd(), 01777) != 0))
    throw Error(ErrorCode::kEnvironment,
                errno_message("cannot make " + path().string() + " root-owned", errno));
  for (const IndexEntry& entry : list_index().index) remove_dead(entry);
  list(/*remove_dead=*/true);
}

}  // namespace gpulock
