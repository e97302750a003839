// The queue directory (src/queue/queue_directory.h): modes, live and dead waiters, wake-ups,
// planted files.
#include "local/queue_directory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gpulock/error.hpp"
#include "local/gpu_lock_file.h"
#include "local/lock_directory.h"
#include "local/queue_index.h"
#include "local/usability_hint.h"
#include "process/process_identity.h"
#include "queue/ticket.h"
#include "scoped_umask.h"
#include "temp_dir.h"
#include "util/random_id.h"

namespace gpulock {
namespace {

namespace fs = std::filesystem;
using test_support::ScopedUmask;
using test_support::TempDir;

constexpr uid_t kNobody = 65534;

Ticket MakeTicket(std::uint64_t seq) {
  Ticket t;
  t.id = make_lease_id();
  t.seq = seq;
  t.uid = ::geteuid();
  t.user = "tester";
  t.process = self_process_id();
  t.enqueued_at = 1700000000.5 + static_cast<double>(seq);
  t.priority = seq % 2 ? Priority::kLow : Priority::kNormal;
  t.needed = 1;
  t.candidates = {"GPU-5e1f0a7e-0000-4000-8000-000000000000"};
  t.max_utilization_percent = 10;
  t.label = "job " + std::to_string(seq);
  t.command = "sleep " + std::to_string(seq);
  return t;
}

std::optional<struct stat> Lstat(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return st;
}

bool Exists(const fs::path& path) {
  return Lstat(path).has_value();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

void WriteFile(const fs::path& path, const std::string& content, mode_t mode = 0644) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
  ASSERT_EQ(::fchmod(fd, mode), 0);
  ::close(fd);
}

// Opens the file read-write and takes its OFD lock, as a waiter holds its ticket.
UniqueFd HoldLocked(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  EXPECT_TRUE(fd.valid()) << path;
  if (fd) {
    EXPECT_TRUE(try_lock_exclusive(fd.get())) << path;
  }
  return fd;
}

bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

// Runs f in a child process, which is killed if it takes longer than `seconds`: true if it
// finished in time (and did not throw). For calls that must not hang on a planted file.
bool FinishesWithin(unsigned seconds, const std::function<void()>& f) {
  const pid_t child = ::fork();
  if (child < 0) return false;
  if (child == 0) {
    ::alarm(seconds);
    try {
      f();
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return false;
  if (WIFSIGNALED(status)) ADD_FAILURE() << "killed by signal " << WTERMSIG(status) << " (hung?)";
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// What list_index() lists, as the tickets a plan starts from (ticket_of each index entry).
std::vector<Ticket> Listed(const QueueDirectory::Listing& listing) {
  std::vector<Ticket> tickets;
  for (const IndexEntry& e : listing.index) tickets.push_back(ticket_of(e));
  return tickets;
}

std::vector<std::string> Ids(const std::vector<Ticket>& tickets) {
  std::vector<std::string> ids;
  for (const Ticket& t : tickets) ids.push_back(t.id);
  return ids;
}

bool Contains(const std::vector<Ticket>& tickets, const std::string& id) {
  return std::any_of(tickets.begin(), tickets.end(), [&](const Ticket& t) { return t.id == id; });
}

// --- opening ------------------------------------------------------------------------------

class QueueDirectoryOpenTest : public ::testing::Test {
 protected:
  TempDir temp_{"queue-open"};
};

// Found failing: open() calls mkdirat() whatever `create` says, so open(create=false) creates the
// queue directory and returns it instead of nullptr: mere readers (`gpulock queue`, `gpulock
// status`) create it, owned by whoever runs them first.
TEST_F(QueueDirectoryOpenTest, WithoutCreateOnFreshLockDirectoryReturnsNull) {
  const LockDirectory locks = LockDirectory::open(temp_.path() / "locks");
  EXPECT_FALSE(QueueDirectory::open(locks, /*create=*/false)) << "expected nullptr";
  EXPECT_FALSE(Exists(locks.path() / "queue")) << "open(create=false) created the directory";
}

TEST_F(QueueDirectoryOpenTest, CreatesSticky1777WhateverTheUmask) {
  int n = 0;
  for (mode_t mask : {mode_t{077}, mode_t{022}, mode_t{0}, mode_t{0777}}) {
    const LockDirectory locks = LockDirectory::open(temp_.path() / ("locks" + std::to_string(n++)));
    ScopedUmask scoped(mask);
    const auto queue = QueueDirectory::open(locks, /*create=*/true);
    ASSERT_NE(queue, nullptr);
    EXPECT_EQ(queue->path(), locks.path() / "queue");
    EXPECT_GE(queue->fd(), 0);
    const auto st = Lstat(locks.path() / "queue");
    ASSERT_TRUE(st.has_value());
    EXPECT_TRUE(S_ISDIR(st->st_mode));
    EXPECT_EQ(st->st_mode & 07777, 01777u) << "umask " << std::oct << mask;
  }
}

TEST_F(QueueDirectoryOpenTest, WithoutCreateOpensTheExistingDirectory) {
  const LockDirectory locks = LockDirectory::open(temp_.path() / "locks");
  const auto created = QueueDirectory::open(locks, /*create=*/true);
  ASSERT_NE(created, nullptr);
  const Ticket t = MakeTicket(1);
  OwnTicket own = created->enter(t);
  const auto existing = QueueDirectory::open(locks, /*create=*/false);
  ASSERT_NE(existing, nullptr);
  EXPECT_EQ(existing->path(), created->path());
  EXPECT_EQ(Ids(existing->list(false).live), std::vector<std::string>{t.id});
  // Opening again with create leaves it as it is.
  EXPECT_NE(QueueDirectory::open(locks, /*create=*/true), nullptr);
  EXPECT_TRUE(existing->is_live(t.id));
}

TEST_F(QueueDirectoryOpenTest, RefusesPlantedSymlink) {
  const LockDirectory locks = LockDirectory::open(temp_.path() / "locks");
  const fs::path elsewhere = temp_.path() / "elsewhere";
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (locks.path() / "queue").c_str()), 0);
  try {
    const auto queue = QueueDirectory::open(locks, /*create=*/true);
    ADD_FAILURE() << "opened a symlinked queue directory: " << (queue ? "non-null" : "nullptr");
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kEnvironment) << error.what();
  }
  const auto st = Lstat(elsewhere);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->st_mode & 07777, 0700u) << "the symlink's target was changed";
}

// --- registering, listing, leaving ----------------------------------------------------------

class QueueDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    queue_ = QueueDirectory::open(locks_, /*create=*/true);
    ASSERT_NE(queue_, nullptr);
  }
  fs::path QueuePath() const { return locks_.path() / "queue"; }
  fs::path TicketPath(const std::string& id) const { return QueuePath() / (id + ".ticket"); }
  fs::path WakePath(const std::string& id) const { return QueuePath() / (id + ".wake"); }

  // Registers a waiter in a child process that then ends without leaving the queue: what a
  // SIGKILLed waiter leaves behind. Returns its ticket.
  Ticket EnterAndDie(std::uint64_t seq) {
    Ticket t = MakeTicket(seq);
    const pid_t child = ::fork();
    if (child == 0) {
      try {
        const auto queue = QueueDirectory::open(LockDirectory::open(locks_.path()), true);
        t.process = self_process_id();
        [[maybe_unused]] auto* leaked = new OwnTicket(queue->enter(t));  // the process just ends
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    int status = 0;
    EXPECT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not enter";
    return t;
  }

  TempDir temp_{"queue"};
  LockDirectory locks_ = LockDirectory::open(temp_.path() / "locks");
  std::unique_ptr<QueueDirectory> queue_;
};

TEST_F(QueueDirectoryTest, EmptyQueueListsNothing) {
  const auto listing = queue_->list(false);
  EXPECT_TRUE(listing.live.empty());
  EXPECT_EQ(listing.highest_seq, 0u);
  EXPECT_TRUE(listing.warnings.empty());
}

TEST_F(QueueDirectoryTest, EnterCreatesLockedTicketAndWakeFifoWithExactModes) {
  ScopedUmask mask(077);
  const Ticket t = MakeTicket(5);
  OwnTicket own = queue_->enter(t);
  ASSERT_TRUE(own);
  EXPECT_EQ(own.ticket().id, t.id);
  EXPECT_GT(own.wake_fd(), 2);

  const auto ticket = Lstat(TicketPath(t.id));
  ASSERT_TRUE(ticket.has_value());
  EXPECT_TRUE(S_ISREG(ticket->st_mode));
  EXPECT_EQ(ticket->st_mode & 07777, 0644u);
  EXPECT_EQ(ticket->st_uid, ::geteuid());
  const auto wake = Lstat(WakePath(t.id));
  ASSERT_TRUE(wake.has_value());
  EXPECT_TRUE(S_ISFIFO(wake->st_mode));
  EXPECT_EQ(wake->st_mode & 07777, 0622u);

  // The file holds the ticket, locked by the waiter.
  const std::optional<Ticket> back = parse_ticket(ReadFile(TicketPath(t.id)));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->id, t.id);
  EXPECT_EQ(back->seq, own.ticket().seq) << "the seq the index gave it";
  UniqueFd other(::open(TicketPath(t.id).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(other);
  EXPECT_TRUE(is_locked_elsewhere(other.get()));
  UniqueFd writer(::open(TicketPath(t.id).c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(writer);
  EXPECT_FALSE(try_lock_exclusive(writer.get()));
}

// Found failing: when enter() fails, its clean-up unlinks "<id>.ticket" and "<id>.wake" whether
// or not this call created them, so a failed enter() with an id already in the queue removes the
// registered waiter's files: it drops out of every listing while it still waits.
TEST_F(QueueDirectoryTest, EnterRefusesAnIdAlreadyInTheQueueAndLeavesItAlone) {
  const Ticket t = MakeTicket(1);
  OwnTicket own = queue_->enter(t);
  EXPECT_THROW(queue_->enter(t), Error);
  EXPECT_TRUE(Exists(TicketPath(t.id))) << "the failed enter() removed the waiter's ticket";
  EXPECT_TRUE(Exists(WakePath(t.id))) << "the failed enter() removed the waiter's wake FIFO";
  EXPECT_TRUE(queue_->is_live(t.id));
  EXPECT_EQ(Ids(queue_->list(false).live), std::vector<std::string>{t.id});
}

TEST_F(QueueDirectoryTest, ListShowsLiveTicketWithItsFields) {
  const Ticket t = MakeTicket(9);
  OwnTicket own = queue_->enter(t);
  const auto listing = queue_->list(false);
  ASSERT_EQ(listing.live.size(), 1u);
  const Ticket& got = listing.live[0];
  EXPECT_EQ(got.id, t.id);
  EXPECT_EQ(got.seq, own.ticket().seq);
  EXPECT_EQ(got.uid, t.uid);
  EXPECT_EQ(got.user, t.user);
  EXPECT_EQ(got.process, t.process);
  EXPECT_EQ(got.enqueued_at, t.enqueued_at);
  EXPECT_EQ(got.priority, t.priority);
  EXPECT_EQ(got.needed, t.needed);
  EXPECT_EQ(got.candidates, t.candidates);
  EXPECT_EQ(got.max_utilization_percent, t.max_utilization_percent);
  EXPECT_EQ(got.label, t.label);
  EXPECT_EQ(got.command, t.command);
  EXPECT_EQ(listing.highest_seq, own.ticket().seq);
  EXPECT_TRUE(listing.warnings.empty());
  EXPECT_TRUE(queue_->is_live(t.id));
}

TEST_F(QueueDirectoryTest, ListSortsLiveTicketsBySeqInOrderOfArrival) {
  // The seq a ticket asks for does not matter: the index gives the next one.
  std::vector<OwnTicket> owners;
  for (std::uint64_t seq : {7, 3, 12, 5, 1}) owners.push_back(queue_->enter(MakeTicket(seq)));
  const auto listing = queue_->list(false);
  std::vector<std::uint64_t> seqs;
  std::vector<std::string> ids;
  for (const Ticket& t : listing.live) {
    seqs.push_back(t.seq);
    ids.push_back(t.id);
  }
  EXPECT_EQ(seqs, (std::vector<std::uint64_t>{1, 2, 3, 4, 5}));
  std::vector<std::string> arrival;
  for (const OwnTicket& own : owners) arrival.push_back(own.ticket().id);
  EXPECT_EQ(ids, arrival);
  EXPECT_EQ(listing.highest_seq, 5u);
  // Each listed ticket is the one its owner registered.
  for (const OwnTicket& own : owners) EXPECT_TRUE(Contains(listing.live, own.ticket().id));
}

TEST_F(QueueDirectoryTest, IndexListsByArrivalWhenAReusedSlotHoldsALaterArrival) {
  // Slots are taken first-free: after the first waiter leaves, the fourth takes its slot, so the
  // table is out of arrival order and the listing must sort it.
  std::vector<OwnTicket> owners;
  for (std::uint64_t seq : {1, 2, 3}) owners.push_back(queue_->enter(MakeTicket(seq)));
  owners.erase(owners.begin());
  owners.push_back(queue_->enter(MakeTicket(4)));
  const auto listing = queue_->list_index();
  std::vector<std::uint64_t> seqs, slots;
  std::vector<std::string> ids, arrival;
  for (const IndexEntry& e : listing.index) {
    seqs.push_back(e.seq);
    slots.push_back(e.slot);
    ids.push_back(e.id);
  }
  for (const OwnTicket& own : owners) arrival.push_back(own.ticket().id);
  EXPECT_EQ(seqs, (std::vector<std::uint64_t>{2, 3, 4}));
  EXPECT_EQ(slots, (std::vector<std::uint64_t>{1, 2, 0}));
  EXPECT_EQ(ids, arrival);
  const std::vector<Ticket> listed = Listed(listing);
  ASSERT_EQ(listed.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(listed[i].id, arrival[i]);
}

// The seqs of the index's entries as listed, and whether they are in arrival order.
std::vector<std::uint64_t> ListedSeqs(const QueueDirectory::Listing& listing) {
  std::vector<std::uint64_t> seqs;
  for (const IndexEntry& e : listing.index) seqs.push_back(e.seq);
  return seqs;
}

TEST_F(QueueDirectoryTest, IndexListsByArrivalAfterAChurn) {
  // Hundreds of waiters leaving from anywhere and newcomers filling their slots: the table is
  // far out of arrival order, with seqs close together (listed in one pass, not sorted).
  std::vector<OwnTicket> owners;
  for (int i = 0; i < 60; ++i) owners.push_back(queue_->enter(MakeTicket(0)));
  std::minstd_rand pick(7);
  for (int round = 0; round < 300; ++round) {
    OwnTicket& leaving = owners[pick() % owners.size()];
    leaving.leave();
    leaving = queue_->enter(MakeTicket(0));
  }
  std::sort(owners.begin(), owners.end(),
            [](const OwnTicket& a, const OwnTicket& b) { return a.ticket().seq < b.ticket().seq; });
  const auto listing = queue_->list_index();
  std::vector<std::uint64_t> expected;
  for (const OwnTicket& own : owners) expected.push_back(own.ticket().seq);
  EXPECT_EQ(ListedSeqs(listing), expected);
  std::vector<std::string> ids, arrival;
  for (const IndexEntry& e : listing.index) ids.push_back(e.id);
  for (const OwnTicket& own : owners) arrival.push_back(own.ticket().id);
  EXPECT_EQ(ids, arrival);
  EXPECT_FALSE(
      std::is_sorted(listing.index.begin(), listing.index.end(),
                     [](const IndexEntry& a, const IndexEntry& b) { return a.slot < b.slot; }))
      << "the churn left the table in arrival order: this test tests nothing";
}

TEST_F(QueueDirectoryTest, IndexListsByArrivalWhenSeqsAreFarApart) {
  // An old waiter and one that arrived hundreds of registrations later, in an earlier slot.
  OwnTicket first = queue_->enter(MakeTicket(0));
  OwnTicket old = queue_->enter(MakeTicket(0));
  first.leave();
  OwnTicket late;
  for (int round = 0; round < 400; ++round) {
    late.leave();
    late = queue_->enter(MakeTicket(0));
  }
  const auto listing = queue_->list_index();
  EXPECT_EQ(ListedSeqs(listing), (std::vector<std::uint64_t>{old.ticket().seq, late.ticket().seq}));
  ASSERT_EQ(listing.index.size(), 2u);
  EXPECT_EQ(listing.index[0].slot, 1u);
  EXPECT_EQ(listing.index[1].slot, 0u);
}

TEST_F(QueueDirectoryTest, IndexLargerThanOneReadListsEverySlotWithItsFields) {
  // More slots than the first read's buffer holds (1,023 after the header), written straight
  // into the index, each with its own fields; then one emptied in the middle and refilled by a
  // later arrival, so that the table is out of arrival order across the buffer's first end.
  // The reads checked field by field are made on threads of their own, whose buffers start at
  // the first size and grow during that very read.
  QueueIndex index(LockDirectory::open(QueuePath()));
  const auto read_afresh = [&index] {
    QueueIndex::Contents contents;
    std::thread([&] { contents = index.read(); }).join();
    return contents;
  };
  constexpr unsigned kSlots = 1100;
  for (unsigned i = 0; i < kSlots; ++i) {
    IndexEntry entry;
    entry.id = make_lease_id();
    entry.uid = 1000 + i % 3;
    entry.pid = static_cast<pid_t>(100 + i);
    entry.pid_start = 7 * i;
    entry.needed = 1 + i % 5;
    entry.priority = i % 4 == 0 ? Priority::kLow : Priority::kNormal;
    entry.named_gpus = i % 2 == 0;
    entry.shared_units = i % 6;
    entry.shared_slots = i % 7;
    entry.entered_over_limit = i % 3 == 1;
    entry.stored_hint = {
        static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(i >> 8), 1, 2, 3, 4};
    index.add(entry, index.read());
  }
  QueueIndex::Contents before = read_afresh();
  ASSERT_EQ(before.entries.size(), kSlots);
  const IndexEntry moved = before.entries[1050];
  index.remove(moved.slot, moved.seq);
  EXPECT_EQ(index.read().first_free, moved.slot);
  IndexEntry latest = moved;
  latest.id = make_lease_id();
  latest = index.add(latest, index.read());
  ASSERT_EQ(latest.slot, moved.slot);

  const QueueIndex::Contents after = read_afresh();
  ASSERT_EQ(after.entries.size(), kSlots);
  EXPECT_EQ(after.first_free, kSlots);
  for (unsigned n = 0; n + 1 < kSlots; ++n) {
    const IndexEntry& e = after.entries[n];
    const unsigned i = n < 1050 ? n : n + 1;  // the entry written i-th
    ASSERT_EQ(e.seq, before.entries[i].seq) << n;
    EXPECT_EQ(e.slot, i);
    EXPECT_EQ(e.id, before.entries[i].id);
    EXPECT_EQ(e.uid, 1000 + i % 3);
    EXPECT_EQ(e.pid, static_cast<pid_t>(100 + i));
    EXPECT_EQ(e.pid_start, 7u * i);
    EXPECT_EQ(e.needed, 1 + i % 5);
    EXPECT_EQ(e.priority, i % 4 == 0 ? Priority::kLow : Priority::kNormal);
    EXPECT_EQ(e.named_gpus, i % 2 == 0);
    EXPECT_EQ(e.shared_units, i % 6);
    EXPECT_EQ(e.shared_slots, i % 7);
    EXPECT_EQ(e.entered_over_limit, i % 3 == 1);
    EXPECT_EQ(e.stored_hint,
              (std::array<std::uint8_t, UsabilityHint::kStoredSize>{
                  static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(i >> 8), 1, 2, 3, 4}));
  }
  EXPECT_EQ(after.entries.back().seq, latest.seq);
  EXPECT_EQ(after.entries.back().slot, moved.slot);
  EXPECT_EQ(after.entries.back().id, latest.id);
  EXPECT_EQ(after.next_seq, latest.seq + 1);
}

TEST_F(QueueDirectoryTest, IndexWithOneSeqTwiceListsBothByArrival) {
  // A forged slot: a copy of a live waiter's slot elsewhere in the table, out of order.
  std::vector<OwnTicket> owners;
  for (int i = 0; i < 3; ++i) owners.push_back(queue_->enter(MakeTicket(0)));
  owners[0].leave();
  owners[0] = queue_->enter(MakeTicket(0));  // slot 0, the latest seq
  {
    UniqueFd index(::open((QueuePath() / "index").c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(index);
    char slot[64];
    ASSERT_EQ(::pread(index.get(), slot, sizeof slot, 64 * 2), 64);   // slot 1
    ASSERT_EQ(::pwrite(index.get(), slot, sizeof slot, 64 * 5), 64);  // as slot 4
  }
  const std::uint64_t twice = owners[1].ticket().seq;
  EXPECT_EQ(
      ListedSeqs(queue_->list_index()),
      (std::vector<std::uint64_t>{twice, twice, owners[2].ticket().seq, owners[0].ticket().seq}));
}

TEST_F(QueueDirectoryTest, ListingSeesChangesBetweenCalls) {
  OwnTicket a = queue_->enter(MakeTicket(1));
  EXPECT_EQ(queue_->list(false).live.size(), 1u);
  OwnTicket b = queue_->enter(MakeTicket(2));
  EXPECT_EQ(Ids(queue_->list(false).live),
            (std::vector<std::string>{a.ticket().id, b.ticket().id}));
  a.leave();
  EXPECT_EQ(Ids(queue_->list(false).live), std::vector<std::string>{b.ticket().id});
  b.leave();
  EXPECT_TRUE(queue_->list(false).live.empty());
}

TEST_F(QueueDirectoryTest, ListingFromSeveralThreadsAtOnce) {
  std::vector<OwnTicket> owners;
  for (std::uint64_t seq = 1; seq <= 3; ++seq) owners.push_back(queue_->enter(MakeTicket(seq)));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 200; ++k) {
        const auto listing = queue_->list(false);
        if (listing.live.size() != 3 || listing.highest_seq != 3) ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(QueueDirectoryTest, LeaveRemovesBothFiles) {
  const Ticket t = MakeTicket(1);
  OwnTicket own = queue_->enter(t);
  ASSERT_TRUE(Exists(TicketPath(t.id)));
  ASSERT_TRUE(Exists(WakePath(t.id)));
  own.leave();
  EXPECT_FALSE(own);
  EXPECT_FALSE(Exists(TicketPath(t.id)));
  EXPECT_FALSE(Exists(WakePath(t.id)));
  EXPECT_TRUE(queue_->list(false).live.empty());
  EXPECT_FALSE(queue_->is_live(t.id));
  own.leave();  // twice: nothing happens
  EXPECT_FALSE(own);
}

TEST_F(QueueDirectoryTest, DestroyingTheOwnTicketLeaves) {
  const Ticket t = MakeTicket(1);
  {
    OwnTicket own = queue_->enter(t);
    ASSERT_TRUE(queue_->is_live(t.id));
  }
  EXPECT_FALSE(Exists(TicketPath(t.id)));
  EXPECT_FALSE(Exists(WakePath(t.id)));
  EXPECT_FALSE(queue_->is_live(t.id));
}

TEST_F(QueueDirectoryTest, MovedOwnTicketStaysRegistered) {
  const Ticket t = MakeTicket(1);
  OwnTicket kept;
  {
    OwnTicket own = queue_->enter(t);
    OwnTicket moved(std::move(own));
    kept = std::move(moved);
  }  // the moved-from objects are destroyed here
  ASSERT_TRUE(kept);
  EXPECT_TRUE(queue_->is_live(t.id));
  EXPECT_TRUE(Exists(WakePath(t.id)));
  EXPECT_EQ(Ids(queue_->list(false).live), std::vector<std::string>{t.id});
  kept.leave();
  EXPECT_FALSE(Exists(TicketPath(t.id)));
}

TEST_F(QueueDirectoryTest, AssigningOverARegistrationLeavesTheOldOne) {
  const Ticket first = MakeTicket(1);
  const Ticket second = MakeTicket(2);
  OwnTicket own = queue_->enter(first);
  own = queue_->enter(second);
  EXPECT_FALSE(Exists(TicketPath(first.id)));
  EXPECT_FALSE(Exists(WakePath(first.id)));
  EXPECT_EQ(own.ticket().id, second.id);
  EXPECT_EQ(Ids(queue_->list(false).live), std::vector<std::string>{second.id});
}

// --- waiters that died --------------------------------------------------------------------

TEST_F(QueueDirectoryTest, DeadWaiterIsNotLiveAndItsFilesAreRemoved) {
  OwnTicket alive = queue_->enter(MakeTicket(10));
  const Ticket dead = EnterAndDie(50);
  ASSERT_TRUE(Exists(TicketPath(dead.id)));
  ASSERT_TRUE(Exists(WakePath(dead.id)));

  EXPECT_FALSE(queue_->is_live(dead.id));
  EXPECT_TRUE(queue_->is_live(alive.ticket().id));
  const auto listing = queue_->list(false);
  EXPECT_EQ(Ids(listing.live), std::vector<std::string>{alive.ticket().id});
  EXPECT_EQ(listing.highest_seq, 2u) << "highest_seq counts dead tickets too";
  // Without remove_dead the files stay.
  EXPECT_TRUE(Exists(TicketPath(dead.id)));
  EXPECT_TRUE(Exists(WakePath(dead.id)));

  const auto cleaning = queue_->list(true);
  EXPECT_EQ(Ids(cleaning.live), std::vector<std::string>{alive.ticket().id});
  EXPECT_FALSE(Exists(TicketPath(dead.id)));
  EXPECT_FALSE(Exists(WakePath(dead.id)));
  // The live waiter's files are untouched.
  EXPECT_TRUE(Exists(TicketPath(alive.ticket().id)));
  EXPECT_TRUE(Exists(WakePath(alive.ticket().id)));
  EXPECT_TRUE(queue_->is_live(alive.ticket().id));
}

TEST_F(QueueDirectoryTest, RootRemovesOtherUsersDeadWaiters) {
  ASSERT_EQ(::geteuid(), 0u) << "this test needs root";
  const Ticket dead = EnterAndDie(3);
  ASSERT_EQ(::chown(TicketPath(dead.id).c_str(), kNobody, kNobody), 0);
  ASSERT_EQ(::chown(WakePath(dead.id).c_str(), kNobody, kNobody), 0);
  queue_->list(true);
  EXPECT_FALSE(Exists(TicketPath(dead.id)));
  EXPECT_FALSE(Exists(WakePath(dead.id)));
}

TEST_F(QueueDirectoryTest, PrepareMakesTheDirectoryRootOwnedAndRemovesDeadWaiters) {
  ASSERT_EQ(::geteuid(), 0u) << "this test needs root";
  ASSERT_EQ(::chown(QueuePath().c_str(), kNobody, kNobody), 0);
  ASSERT_EQ(::chmod(QueuePath().c_str(), 0755), 0);
  const Ticket dead = EnterAndDie(3);
  OwnTicket alive = queue_->enter(MakeTicket(4));
  queue_->prepare();
  const auto st = Lstat(QueuePath());
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->st_uid, 0u);
  EXPECT_EQ(st->st_mode & 07777, 01777u);
  EXPECT_FALSE(Exists(TicketPath(dead.id)));
  EXPECT_FALSE(Exists(WakePath(dead.id)));
  EXPECT_TRUE(queue_->is_live(alive.ticket().id));
}

TEST_F(QueueDirectoryTest, IsLiveOfUnknownIdIsFalse) {
  EXPECT_FALSE(queue_->is_live(make_lease_id()));
}

// --- waking -------------------------------------------------------------------------------

TEST_F(QueueDirectoryTest, WakeMakesOnlyThatWaitersFdReadable) {
  OwnTicket a = queue_->enter(MakeTicket(1));
  OwnTicket b = queue_->enter(MakeTicket(2));
  EXPECT_FALSE(Readable(a.wake_fd(), 0));
  EXPECT_FALSE(Readable(b.wake_fd(), 0));
  queue_->wake(a.ticket().id);
  EXPECT_TRUE(Readable(a.wake_fd(), 1000));
  EXPECT_FALSE(Readable(b.wake_fd(), 0));
  a.drain_wakeups();
  EXPECT_FALSE(Readable(a.wake_fd(), 0));
  // Several wake-ups, one drain.
  for (int i = 0; i < 5; ++i) queue_->wake(b.ticket().id);
  EXPECT_TRUE(Readable(b.wake_fd(), 1000));
  b.drain_wakeups();
  EXPECT_FALSE(Readable(b.wake_fd(), 0));
}

TEST_F(QueueDirectoryTest, WakeFromAnotherQueueDirectoryObject) {
  OwnTicket own = queue_->enter(MakeTicket(1));
  const auto other = QueueDirectory::open(LockDirectory::open(locks_.path()), false);
  ASSERT_NE(other, nullptr);
  other->wake(own.ticket().id);
  EXPECT_TRUE(Readable(own.wake_fd(), 1000));
}

TEST_F(QueueDirectoryTest, WakeManyTimesDoesNotBlockWhenTheFifoIsFull) {
  OwnTicket own = queue_->enter(MakeTicket(1));
  const std::string id = own.ticket().id;
  // The smallest pipe the kernel allows (one page), so that a few thousand wakes fill it: the
  // test checks that a full fifo does not block, not how fast wakes are (100,000 wakes into
  // the default 64 KiB took over 10 s on a loaded CI machine). 60 s is for a hang only.
  const int capacity = ::fcntl(own.wake_fd(), F_SETPIPE_SZ, 4096);
  ASSERT_GT(capacity, 0) << std::strerror(errno);
  const int wakes = 2 * capacity;
  EXPECT_TRUE(FinishesWithin(60, [&] {
    for (int i = 0; i < wakes; ++i) queue_->wake(id);
  }));
  EXPECT_TRUE(Readable(own.wake_fd(), 1000));
  own.drain_wakeups();
  EXPECT_FALSE(Readable(own.wake_fd(), 0));
}

TEST_F(QueueDirectoryTest, WakeOfMissingIdDoesNothing) {
  OwnTicket own = queue_->enter(MakeTicket(1));
  const std::string missing = make_lease_id();
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->wake(missing); }));
  queue_->wake(missing);
  EXPECT_FALSE(Exists(WakePath(missing)));
  EXPECT_FALSE(Readable(own.wake_fd(), 0));
}

TEST_F(QueueDirectoryTest, WakeOfLeftWaiterDoesNotHang) {
  OwnTicket own = queue_->enter(MakeTicket(1));
  const std::string id = own.ticket().id;
  own.leave();
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->wake(id); }));
}

TEST_F(QueueDirectoryTest, WakeOfPlantedFifoWithoutReaderDoesNotHang) {
  const std::string id = make_lease_id();
  ASSERT_EQ(::mkfifo(WakePath(id).c_str(), 0666), 0);
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->wake(id); }));
}

TEST_F(QueueDirectoryTest, WakeDoesNotWriteIntoPlantedRegularFile) {
  const std::string id = make_lease_id();
  WriteFile(WakePath(id), "precious", 0666);
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->wake(id); }));
  queue_->wake(id);
  EXPECT_EQ(ReadFile(WakePath(id)), "precious");
}

TEST_F(QueueDirectoryTest, WakeDoesNotFollowPlantedSymlinkToRegularFile) {
  const std::string id = make_lease_id();
  const fs::path target = temp_.path() / "target";
  WriteFile(target, "precious", 0666);
  ASSERT_EQ(::symlink(target.c_str(), WakePath(id).c_str()), 0);
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->wake(id); }));
  queue_->wake(id);
  EXPECT_EQ(ReadFile(target), "precious");
}

TEST_F(QueueDirectoryTest, WakeDoesNotFollowPlantedSymlinkToFifo) {
  const std::string id = make_lease_id();
  const fs::path target = temp_.path() / "target.fifo";
  ASSERT_EQ(::mkfifo(target.c_str(), 0666), 0);
  // A reader on the target, so that a write through the symlink would succeed.
  UniqueFd reader(::open(target.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  ASSERT_TRUE(reader);
  ASSERT_EQ(::symlink(target.c_str(), WakePath(id).c_str()), 0);
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->wake(id); }));
  queue_->wake(id);
  EXPECT_FALSE(Readable(reader.get(), 100)) << "wake() wrote through a symlink";
}

TEST_F(QueueDirectoryTest, WakeOfPlantedDirectoryDoesNothing) {
  const std::string id = make_lease_id();
  ASSERT_EQ(::mkdir(WakePath(id).c_str(), 0777), 0);
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->wake(id); }));
  EXPECT_TRUE(fs::is_directory(WakePath(id)));
}

// --- planted entries ----------------------------------------------------------------------

TEST_F(QueueDirectoryTest, SymlinkToLockedTicketElsewhereIsNotLive) {
  const Ticket t = MakeTicket(77);
  const fs::path target = temp_.path() / "elsewhere.ticket";
  WriteFile(target, serialize_ticket(t));
  const UniqueFd held = HoldLocked(target);  // a live ticket, if the symlink were followed
  ASSERT_EQ(::symlink(target.c_str(), TicketPath(t.id).c_str()), 0);

  const auto listing = queue_->list(false);
  EXPECT_FALSE(Contains(listing.live, t.id));
  EXPECT_NE(listing.highest_seq, 77u) << "read a ticket through a symlink";
  EXPECT_FALSE(queue_->is_live(t.id));
  queue_->list(true);
  EXPECT_EQ(ReadFile(target), serialize_ticket(t)) << "the symlink's target was changed";
}

TEST_F(QueueDirectoryTest, PlantedFifoTicketDoesNotHang) {
  const std::string id = make_lease_id();
  ASSERT_EQ(::mkfifo(TicketPath(id).c_str(), 0666), 0);
  OwnTicket own = queue_->enter(MakeTicket(1));
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->list(false); }));
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->list(true); }));
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->is_live(id); }));
  const auto listing = queue_->list(false);
  EXPECT_EQ(Ids(listing.live), std::vector<std::string>{own.ticket().id});
  EXPECT_FALSE(queue_->is_live(id));
}

TEST_F(QueueDirectoryTest, PlantedFifoTicketWithAWriterDoesNotHang) {
  // A writer keeps the FIFO open: a blocking read of it would wait for data forever.
  const std::string id = make_lease_id();
  ASSERT_EQ(::mkfifo(TicketPath(id).c_str(), 0666), 0);
  UniqueFd reader(::open(TicketPath(id).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  UniqueFd writer(::open(TicketPath(id).c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
  ASSERT_TRUE(writer);
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->list(false); }));
  EXPECT_TRUE(FinishesWithin(5, [&] { queue_->list(true); }));
  EXPECT_FALSE(Contains(queue_->list(false).live, id));
}

TEST_F(QueueDirectoryTest, PlantedDirectoryTicketIsNotLive) {
  const std::string id = make_lease_id();
  ASSERT_EQ(::mkdir(TicketPath(id).c_str(), 0777), 0);
  OwnTicket own = queue_->enter(MakeTicket(1));
  const auto listing = queue_->list(false);
  EXPECT_EQ(Ids(listing.live), std::vector<std::string>{own.ticket().id});
  EXPECT_FALSE(queue_->is_live(id));
  EXPECT_NO_THROW(queue_->list(true));
  EXPECT_TRUE(queue_->is_live(own.ticket().id));
}

TEST_F(QueueDirectoryTest, LockedGarbageIsNotLiveAndWarns) {
  const std::string id = make_lease_id();
  WriteFile(TicketPath(id), "this is not a ticket\n");
  const UniqueFd held = HoldLocked(TicketPath(id));
  OwnTicket own = queue_->enter(MakeTicket(1));
  const auto listing = queue_->list(false);
  EXPECT_EQ(Ids(listing.live), std::vector<std::string>{own.ticket().id});
  ASSERT_EQ(listing.warnings.size(), 1u);
  EXPECT_NE(listing.warnings[0].find(id), std::string::npos) << listing.warnings[0];
  EXPECT_NO_THROW(queue_->list(true));
}

TEST_F(QueueDirectoryTest, LockedTicketWithAnotherIdIsNotLive) {
  // A valid ticket under another name (here a hard link to a live one): counted once.
  OwnTicket own = queue_->enter(MakeTicket(1));
  const std::string other = make_lease_id();
  ASSERT_EQ(::link(TicketPath(own.ticket().id).c_str(), TicketPath(other).c_str()), 0);
  const auto listing = queue_->list(false);
  EXPECT_EQ(Ids(listing.live), std::vector<std::string>{own.ticket().id});
}

TEST_F(QueueDirectoryTest, NamesThatAreNotLeaseIdsAreIgnored) {
  const Ticket t = MakeTicket(1);
  std::vector<UniqueFd> held;
  for (const std::string& name : std::vector<std::string>{
           "notanid.ticket", "0123456789ABCDEF.ticket", ".ticket", t.id.str() + ".ticket.tmp"}) {
    WriteFile(QueuePath() / name, serialize_ticket(t));
    held.push_back(HoldLocked(QueuePath() / name));
  }
  const auto listing = queue_->list(false);
  EXPECT_TRUE(listing.live.empty()) << listing.live.size() << " live";
}

TEST_F(QueueDirectoryTest, TicketSeenEmptyIsReadAgainOnceWritten) {
  // A ticket being registered is empty for a moment; a listing then must not stick to that.
  const Ticket t = MakeTicket(4);
  WriteFile(TicketPath(t.id), "");
  const UniqueFd held = HoldLocked(TicketPath(t.id));
  EXPECT_FALSE(Contains(queue_->list(false).live, t.id));
  const std::string bytes = serialize_ticket(t);
  ASSERT_EQ(::pwrite(held.get(), bytes.data(), bytes.size(), 0),
            static_cast<ssize_t>(bytes.size()));
  EXPECT_TRUE(Contains(queue_->list(false).live, t.id));
}

TEST_F(QueueDirectoryTest, TicketReplacedUnderTheSameNameIsReadAgain) {
  Ticket t = MakeTicket(4);
  WriteFile(TicketPath(t.id), serialize_ticket(t));
  const UniqueFd first = HoldLocked(TicketPath(t.id));  // keeps the old inode alive
  ASSERT_EQ(queue_->list(false).live.at(0).seq, 4u);
  t.seq = 8;
  const fs::path fresh = QueuePath() / "fresh";
  WriteFile(fresh, serialize_ticket(t));
  const UniqueFd second = HoldLocked(fresh);
  ASSERT_EQ(::rename(fresh.c_str(), TicketPath(t.id).c_str()), 0);
  const auto listing = queue_->list(false);
  ASSERT_EQ(listing.live.size(), 1u);
  EXPECT_EQ(listing.live[0].seq, 8u);
}

// --- tickets claiming another user ----------------------------------------------------------

TEST_F(QueueDirectoryTest, TicketOwnedByAnotherUidThanItClaimsIsIgnored) {
  ASSERT_EQ(::geteuid(), 0u) << "this test needs root";
  Ticket t = MakeTicket(1);
  t.uid = 0;  // claims root...
  OwnTicket own = queue_->enter(t);
  ASSERT_TRUE(Contains(queue_->list(false).live, t.id));
  ASSERT_EQ(::chown(TicketPath(t.id).c_str(), kNobody, kNobody), 0);  // ...in nobody's file
  const auto listing = queue_->list(false);
  EXPECT_FALSE(Contains(listing.live, t.id));
  ASSERT_EQ(listing.warnings.size(), 1u);
  EXPECT_NE(listing.warnings[0].find(t.id), std::string::npos) << listing.warnings[0];
}

TEST_F(QueueDirectoryTest, TicketClaimingAnotherUserThanItsOwnerIsIgnored) {
  ASSERT_EQ(::geteuid(), 0u) << "this test needs root";
  Ticket t = MakeTicket(1);
  t.uid = kNobody;  // claims nobody, in root's file
  OwnTicket own = queue_->enter(t);
  const auto listing = queue_->list(false);
  EXPECT_FALSE(Contains(listing.live, t.id));
  EXPECT_EQ(listing.warnings.size(), 1u);
  // The control: once the file is nobody's, it is nobody's valid ticket.
  ASSERT_EQ(::chown(TicketPath(t.id).c_str(), kNobody, kNobody), 0);
  const auto owned = queue_->list(false);
  ASSERT_TRUE(Contains(owned.live, t.id));
  EXPECT_EQ(owned.live[0].uid, kNobody);
  EXPECT_TRUE(owned.warnings.empty());
}

// --- the index (issue 12: planning without reading every ticket) -------------------------

TEST_F(QueueDirectoryTest, IndexListsWaitersInArrivalOrderWithTheirOrderingFields) {
  Ticket big = MakeTicket(0);
  big.needed = 3;
  big.priority = Priority::kLow;
  OwnTicket first = queue_->enter(MakeTicket(0));
  OwnTicket second = queue_->enter(big);
  const auto listing = queue_->list_index();
  const std::vector<Ticket> listed = Listed(listing);
  ASSERT_EQ(listed.size(), 2u);
  ASSERT_EQ(listing.index.size(), 2u);
  EXPECT_EQ(Ids(listed), (std::vector<std::string>{first.ticket().id, second.ticket().id}));
  EXPECT_LT(listed[0].seq, listed[1].seq);
  EXPECT_EQ(listed[1].needed, 3u);
  EXPECT_EQ(listed[1].priority, Priority::kLow);
  EXPECT_EQ(listed[1].process.pid, ::getpid());
  EXPECT_TRUE(listed[1].candidates.empty()) << "details come from read_ticket()";
  EXPECT_EQ(listing.highest_seq, listed[1].seq);
}

TEST_F(QueueDirectoryTest, ReadTicketGivesTheDetailsOfALiveWaiterOnly) {
  OwnTicket own = queue_->enter(MakeTicket(0));
  const auto listing = queue_->list_index();
  ASSERT_EQ(listing.index.size(), 1u);
  const std::optional<Ticket> read = queue_->read_ticket(listing.index[0]);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->candidates, own.ticket().candidates);
  EXPECT_EQ(read->command, own.ticket().command);
  const Ticket dead = EnterAndDie(0);
  const auto after = queue_->list_index();
  ASSERT_EQ(after.index.size(), 2u) << "a waiter that died keeps its slot until found dead";
  EXPECT_FALSE(queue_->read_ticket(after.index[1]).has_value());
  EXPECT_EQ(after.index[1].id, dead.id);
}

TEST_F(QueueDirectoryTest, ASlotCarriesTheHintOfItsTicketAndAForgedHintIsNotBelieved) {
  Ticket t = MakeTicket(0);
  t.candidates.push_back("GPU-5e1f0a7e-0000-4000-8000-000000000001");
  OwnTicket own = queue_->enter(t);
  const auto listing = queue_->list_index();
  ASSERT_EQ(listing.index.size(), 1u);
  EXPECT_EQ(listing.index[0].hint(), UsabilityHint::of(own.ticket()));
  EXPECT_TRUE(listing.index[0].hint().known);
  EXPECT_FALSE(listing.index[0].hint().foreign_check_only) << "it has a utilisation filter";

  // The slot rewritten in place with the same seq: a hint that disagrees with the ticket makes
  // the slot not count, as any other field would; no hint (an older version's slot) is fine.
  QueueIndex index(LockDirectory::open(QueuePath()));
  const auto rewrite = [&](UsabilityHint hint) {
    QueueIndex::Contents at_own_slot;
    at_own_slot.next_seq = listing.index[0].seq;
    at_own_slot.first_free = listing.index[0].slot;
    IndexEntry entry = listing.index[0];
    entry.stored_hint = hint.stored();
    index.add(entry, at_own_slot);
    const auto again = queue_->list_index();
    EXPECT_EQ(again.index.size(), 1u);
    return queue_->read_ticket(again.index.at(0)).has_value();
  };
  UsabilityHint forged = listing.index[0].hint();
  forged.candidate_bits = ~forged.candidate_bits & ((std::uint64_t{1} << 40) - 1);
  EXPECT_TRUE(rewrite(listing.index[0].hint()));
  EXPECT_FALSE(rewrite(forged)) << "also once the ticket was read and is kept open";
  EXPECT_TRUE(rewrite(UsabilityHint()));
  EXPECT_FALSE(rewrite(forged));
  const auto fresh = QueueDirectory::open(locks_, false);
  ASSERT_TRUE(fresh);
  EXPECT_FALSE(fresh->read_ticket(queue_->list_index().index.at(0)).has_value())
      << "nor by a reader that never read it before";
}

TEST_F(QueueDirectoryTest, AWaiterKilledBetweenTheUnlinksOfItsLeavingIsCleanedUpFromItsSlot) {
  // OwnTicket::leave() unlinks the ticket, then the wake FIFO, then empties the slot. A child
  // does the first step and ends (a SIGKILL there): the slot is left, and with it whoever finds
  // the waiter dead finds the FIFO. (With the slot emptied first, the FIFO was left where only
  // a sweep of the whole directory could find it, and remove_dead() skipped a FIFO whose ticket
  // was gone.)
  Ticket t = MakeTicket(0);
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      const auto queue = QueueDirectory::open(LockDirectory::open(locks_.path()), true);
      t.process = self_process_id();
      [[maybe_unused]] auto* leaked = new OwnTicket(queue->enter(t));
      ::_exit(::unlink(TicketPath(t.id).c_str()) == 0 ? 0 : 2);
    } catch (...) {
      ::_exit(1);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_FALSE(Exists(TicketPath(t.id)));
  ASSERT_TRUE(Exists(WakePath(t.id)));
  const auto listing = queue_->list_index();
  ASSERT_EQ(listing.index.size(), 1u);
  EXPECT_TRUE(queue_->remove_dead(listing.index[0]));
  EXPECT_FALSE(Exists(WakePath(t.id)));
  EXPECT_TRUE(queue_->list_index().index.empty());
}

TEST_F(QueueDirectoryTest, ALeavingWaiterWhoseTicketIsUnlinkedKeepsItsSlotUntilItEmptiesIt) {
  // Between the unlinks and the slot, a leaving waiter's ticket is no longer live, but its
  // process is: others leave its slot alone (emptying it too could empty it after a newcomer
  // took it), and the waiter empties it itself.
  OwnTicket leaving = queue_->enter(MakeTicket(0));
  ASSERT_EQ(::unlink(TicketPath(leaving.ticket().id).c_str()), 0);
  const auto listing = queue_->list_index();
  ASSERT_EQ(listing.index.size(), 1u);
  EXPECT_FALSE(queue_->is_live(leaving.ticket().id));
  EXPECT_FALSE(queue_->remove_dead(listing.index[0]));
  EXPECT_EQ(queue_->list_index().index.size(), 1u);
  leaving.leave();
  EXPECT_TRUE(queue_->list_index().index.empty());
  EXPECT_FALSE(Exists(WakePath(listing.index[0].id)));
}

TEST_F(QueueDirectoryTest, LeavingClearsTheSlotAndRemoveDeadClearsADeadWaitersSlot) {
  OwnTicket leaving = queue_->enter(MakeTicket(0));
  const Ticket dead = EnterAndDie(0);
  OwnTicket staying = queue_->enter(MakeTicket(0));
  leaving.leave();
  auto listing = queue_->list_index();
  EXPECT_EQ(Ids(Listed(listing)), (std::vector<std::string>{dead.id, staying.ticket().id}));
  queue_->remove_dead(listing.index[0]);
  queue_->remove_dead(listing.index[1]);  // live: stays
  EXPECT_EQ(Ids(Listed(queue_->list_index())), std::vector<std::string>{staying.ticket().id});
  EXPECT_FALSE(Exists(TicketPath(dead.id))) << "our own dead waiter's files go too";
  // Freed slots are reused, and seqs keep growing.
  OwnTicket next = queue_->enter(MakeTicket(0));
  EXPECT_GT(next.ticket().seq, staying.ticket().seq);
  EXPECT_EQ(Listed(queue_->list_index()).size(), 2u);
}

TEST_F(QueueDirectoryTest, ForgedOrDamagedIndexIsIgnoredNotFatal) {
  OwnTicket own = queue_->enter(MakeTicket(0));
  {
    // Garbage after the real slots, and a header claiming an absurd next seq.
    UniqueFd index(::open((QueuePath() / "index").c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(index);
    const std::string garbage(64 * 5, '\x7f');
    ASSERT_EQ(::pwrite(index.get(), garbage.data(), garbage.size(), 64 * 4),
              static_cast<ssize_t>(garbage.size()));
    const std::uint64_t huge = ~std::uint64_t{0};
    ASSERT_EQ(::pwrite(index.get(), &huge, sizeof huge, 16), 8);
  }
  const auto listing = queue_->list_index();
  EXPECT_EQ(Ids(Listed(listing)), std::vector<std::string>{own.ticket().id});
  OwnTicket next = queue_->enter(MakeTicket(0));
  EXPECT_EQ(next.ticket().seq, own.ticket().seq + 1) << "a forged next seq is not believed";
  EXPECT_EQ(Listed(queue_->list_index()).size(), 2u);
}

TEST_F(QueueDirectoryTest, ForkedChildDoesNotKeepTheTicketAlive) {
  // Issue 12: Python multiprocessing or a C fork() while waiting, then the waiter is killed:
  // the child must not keep the ticket's lock, or the dead waiter stays at the queue's head.
  const Ticket t = MakeTicket(0);
  int ready[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  const pid_t waiter = ::fork();
  ASSERT_GE(waiter, 0);
  if (waiter == 0) {
    const auto queue = QueueDirectory::open(LockDirectory::open(locks_.path()), false);
    OwnTicket own = queue->enter(t);
    if (::fork() == 0) {
      // A child that outlives its parent and never leaves the queue itself (off the test's
      // output, which it would otherwise keep open). It says it is ready from here, once fork
      // has returned in it: its fork handlers have run.
      const int null = ::open("/dev/null", O_RDWR);
      for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
      ::sleep(30);
      ::_exit(0);
    }
    while (true) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_TRUE(queue_->is_live(t.id));
  ASSERT_EQ(::kill(waiter, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(waiter, &status, 0), waiter);
  EXPECT_FALSE(queue_->is_live(t.id)) << "the forked child kept the dead waiter's ticket";
}

}  // namespace
}  // namespace gpulock
