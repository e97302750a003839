// The queue's index file: a 64-byte header, then 64-byte slots, each with a checksum so that a
// torn or forged slot is recognised and skipped.
#include "local/queue_index.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "local/lock_directory.h"
#include "queue/ticket.h"
#include "util/random_id.h"

namespace gpulock {

// One slot as stored. Native byte order: the file never leaves the machine.
struct StoredIndexSlot {
  std::uint64_t seq;
  char id[16];
  std::uint32_t uid;
  std::int32_t pid;
  std::uint64_t pid_start;
  std::uint32_t needed;
  std::uint8_t priority;
  std::uint8_t flags;
  std::uint16_t shared_units;  // a shared request's memory units per GPU (0: whole GPUs)
  std::uint16_t shared_slots;  // ... or its slots
  // Its UsabilityHint; zero in slots written before hints (6 bytes left reserved then).
  std::array<std::uint8_t, UsabilityHint::kStoredSize> hint;
  std::uint64_t check;
};

namespace {

constexpr std::size_t kRecordSize = 64;
constexpr char kMagic[8] = {'G', 'P', 'U', 'L', 'O', 'C', 'K', 'Q'};
constexpr std::uint32_t kFormat = 1;
// Above this a seq is not believed (a forged one must not make later arrivals wrap to 0).
constexpr std::uint64_t kMaxSeq = std::uint64_t{1} << 62;
constexpr unsigned kMaxNeeded = 1024;
constexpr std::uint32_t kMaxSlots = 1u << 20;

static_assert(sizeof(StoredIndexSlot) == kRecordSize);

struct RawHeader {
  char magic[8];
  std::uint32_t format;
  std::uint32_t record_size;
  std::uint64_t next_seq;
  std::uint8_t reserved[40];
};
static_assert(sizeof(RawHeader) == kRecordSize);

constexpr std::uint8_t kNamedGpus = 1;
constexpr std::uint8_t kOverLimit = 2;

// A 64-bit mix of every word before the checksum, so that a torn or half-forged slot fails it.
std::uint64_t checksum(const StoredIndexSlot& slot) {
  std::uint64_t words[offsetof(StoredIndexSlot, check) / 8];
  std::memcpy(words, &slot, sizeof words);
  std::uint64_t h = 0x9e3779b97f4a7c15ull;
  for (const std::uint64_t w : words) {
    h ^= w;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return h | 1;  // never 0, so that an all-zero slot never passes
}

void write_exactly(int fd, const void* data, std::size_t size, off_t offset, const char* what) {
  const ssize_t n = ::pwrite(fd, data, size, offset);
  if (n == static_cast<ssize_t>(size)) return;
  const int e = n < 0 ? errno : ENOSPC;
  throw Error(ErrorCode::kEnvironment,
              fmt::format("cannot write the queue's index ({}): {}{}", what, std::strerror(e),
                          e == ENOSPC ? " (the disk is full)" : ""));
}

// Whether a stored slot is a waiter's: checked before anything is made of it. An empty slot, one
// torn by a waiter clearing it right now, or garbage fails.
bool is_valid(const StoredIndexSlot& raw) {
  return raw.seq > 0 && raw.seq <= kMaxSeq && raw.pid > 0 && raw.needed >= 1 &&
         raw.needed <= kMaxNeeded && raw.priority <= 1 && (raw.flags & ~3) == 0 &&
         raw.shared_units <= kMaxSharedUnits && raw.shared_slots <= kMaxSharedUnits &&
         raw.check == checksum(raw) && is_lease_id(std::string_view(raw.id, sizeof raw.id));
}

// A valid slot as the first pass finds it: what ordering needs, 16 bytes instead of an entry.
struct Arrival {
  std::uint64_t seq;
  std::uint32_t record;  // its place in the file (the header is record 0)
};

// Puts `arrivals` in arrival order (by seq, then place). Slots are taken first-free, so after a
// churn (waiters leaving from anywhere, newcomers filling their slots) the table is not in that
// order: then each is placed by its seq, in linear time when the seqs are dense, as a live
// queue's are (the arrivals since the oldest waiter). A seq found twice (a forged slot) or seqs
// far apart fall back to a sort.
void order_by_seq(std::vector<Arrival>& arrivals) {
  const auto earlier = [](const Arrival& a, const Arrival& b) {
    return a.seq != b.seq ? a.seq < b.seq : a.record < b.record;
  };
  if (std::is_sorted(arrivals.begin(), arrivals.end(), earlier)) return;
  const auto [lowest, highest] = std::minmax_element(
      arrivals.begin(), arrivals.end(), [](const auto& a, const auto& b) { return a.seq < b.seq; });
  const std::uint64_t span = highest->seq - lowest->seq + 1;
  if (span <= 4 * arrivals.size() + 64) {
    // Each record at its seq's place in [lowest, highest] (0: none; records start at 1).
    thread_local std::vector<std::uint32_t> at;
    at.assign(span, 0);
    const std::uint64_t base = lowest->seq;
    bool twice = false;
    for (std::size_t n = 0; n < arrivals.size() && !twice; ++n) {
      std::uint32_t& place = at[arrivals[n].seq - base];
      twice = place != 0;
      place = arrivals[n].record;
    }
    if (!twice) {
      std::size_t n = 0;
      for (std::uint64_t offset = 0; offset < span; ++offset)
        if (at[offset] != 0) arrivals[n++] = Arrival{base + offset, at[offset]};
      return;
    }
  }
  std::sort(arrivals.begin(), arrivals.end(), earlier);
}

off_t slot_offset(std::uint32_t slot) {
  return static_cast<off_t>(kRecordSize) * (static_cast<off_t>(slot) + 1);
}

}  // namespace

IndexEntry::IndexEntry(const StoredIndexSlot& raw, std::uint32_t slot_number)
    : slot(slot_number),
      seq(raw.seq),
      id(std::string_view(raw.id, sizeof raw.id)),
      uid(raw.uid),
      pid(raw.pid),
      pid_start(raw.pid_start),
      priority(raw.priority == 1 ? Priority::kLow : Priority::kNormal),
      needed(raw.needed),
      named_gpus((raw.flags & kNamedGpus) != 0),
      entered_over_limit((raw.flags & kOverLimit) != 0),
      shared_units(raw.shared_units),
      shared_slots(raw.shared_slots),
      stored_hint(raw.hint) {}

QueueIndex::QueueIndex(const LockDirectory& dir) : fd_(dir.open_shared_file(kFileName)) {}

QueueIndex::Contents QueueIndex::read() const {
  Contents contents;
  // Reused, and never cleared: only the `got` bytes just read are looked at. (Zeroing 64 KiB
  // for every read of a nearly empty index was a tenth of an uncontended acquire.) Records, so
  // that slots are read where they lie: a slot copied aside and read back in other widths than
  // it was copied in stalls the CPU at every field.
  thread_local std::unique_ptr<StoredIndexSlot[]> buffer;
  thread_local std::size_t capacity = 0;  // in records
  if (!buffer) {
    capacity = 1024;
    buffer.reset(new StoredIndexSlot[capacity]);
  }
  std::size_t got = 0;  // bytes
  while (true) {
    char* const bytes = reinterpret_cast<char*>(buffer.get());
    const std::size_t size = capacity * kRecordSize;
    const ssize_t n = ::pread(fd_.get(), bytes + got, size - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw Error(ErrorCode::kEnvironment, errno_message("cannot read the queue's index", errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
    if (got == size) {
      if (capacity >= std::size_t{kMaxSlots} + 1) break;
      std::unique_ptr<StoredIndexSlot[]> larger(new StoredIndexSlot[capacity * 2]);
      std::memcpy(larger.get(), buffer.get(), got);
      buffer = std::move(larger);
      capacity *= 2;
    }
  }
  const std::size_t records = got / kRecordSize;
  if (records > 0) {
    RawHeader header;
    std::memcpy(&header, buffer.get(), sizeof header);
    if (std::memcmp(header.magic, kMagic, sizeof kMagic) == 0 && header.format == kFormat &&
        header.record_size == kRecordSize && header.next_seq <= kMaxSeq)
      contents.next_seq = std::max<std::uint64_t>(header.next_seq, 1);
  }
  // First every slot is checked and the valid ones noted with their seqs; then they are put in
  // arrival order; then each is decoded once, straight into its place. (Entries built one by one
  // and then moved into order cost a plan behind a thousand waiters more than the reading.)
  thread_local std::vector<Arrival> arrivals;
  arrivals.clear();
  bool found_free = false;
  for (std::size_t r = 1; r < records; ++r) {
    const StoredIndexSlot& raw = buffer[r];
    if (!is_valid(raw)) {
      // Free for the next add().
      if (!found_free) contents.first_free = static_cast<std::uint32_t>(r - 1);
      found_free = true;
      continue;
    }
    arrivals.push_back(Arrival{raw.seq, static_cast<std::uint32_t>(r)});
  }
  if (!found_free) contents.first_free = static_cast<std::uint32_t>(records > 0 ? records - 1 : 0);
  order_by_seq(arrivals);
  // Never behind a seq in use, whatever the header says.
  if (!arrivals.empty()) contents.next_seq = std::max(contents.next_seq, arrivals.back().seq + 1);
  contents.entries.reserve(arrivals.size());
  for (const Arrival& arrival : arrivals) {
    // Decoded in place: neither zeroed first (a `rep stos` per entry) nor built aside and
    // copied.
    contents.entries.emplace_back(buffer[arrival.record], arrival.record - 1);
  }
  return contents;
}

IndexEntry QueueIndex::add(IndexEntry entry, const Contents& contents) {
  if (contents.next_seq > kMaxSeq || contents.first_free >= kMaxSlots)
    throw Error(ErrorCode::kEnvironment,
                "the queue's index is full (a million waiters, or a forged seq); `sudo gpulock "
                "init` clears the slots of waiters that ended");
  entry.slot = contents.first_free;
  entry.seq = contents.next_seq;
  StoredIndexSlot raw{};
  raw.seq = entry.seq;
  std::memcpy(raw.id, entry.id.c_str(), std::min(entry.id.size(), sizeof raw.id));
  raw.uid = entry.uid;
  raw.pid = entry.pid;
  raw.pid_start = entry.pid_start;
  raw.needed = entry.needed;
  raw.priority = entry.priority == Priority::kLow ? 1 : 0;
  raw.flags = static_cast<std::uint8_t>((entry.named_gpus ? kNamedGpus : 0) |
                                        (entry.entered_over_limit ? kOverLimit : 0));
  raw.shared_units = static_cast<std::uint16_t>(std::min(entry.shared_units, kMaxSharedUnits));
  raw.shared_slots = static_cast<std::uint16_t>(std::min(entry.shared_slots, kMaxSharedUnits));
  raw.hint = entry.stored_hint;
  raw.check = checksum(raw);
  write_exactly(fd_.get(), &raw, sizeof raw, slot_offset(entry.slot), "a new slot");
  RawHeader header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.format = kFormat;
  header.record_size = kRecordSize;
  header.next_seq = entry.seq + 1;
  write_exactly(fd_.get(), &header, sizeof header, 0, "its header");
  return entry;
}

void QueueIndex::remove(std::uint32_t slot, std::uint64_t seq) const {
  StoredIndexSlot raw{};
  if (::pread(fd_.get(), &raw, sizeof raw, slot_offset(slot)) != sizeof raw || raw.seq != seq)
    return;
  const StoredIndexSlot empty{};
  // Best effort: a slot left behind belongs to a ticket that is no longer live, and the next
  // planner that reaches it clears it.
  [[maybe_unused]] const ssize_t n = ::pwrite(fd_.get(), &empty, sizeof empty, slot_offset(slot));
}

}  // namespace gpulock
