// IdleTracker (gpulock/monitor.hpp): how long each leased GPU has read 0 % utilisation, from
// readings kept across runs in a per-user text file, one line per GPU.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gpulock/monitor.hpp"
#include "util/fd.h"
#include "util/random_id.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

constexpr std::size_t kMaxRecordBytes = 4 * 1024 * 1024;

// The record: this header, then one line per GPU, "KEY LEASE_ID ZERO_SINCE LAST_SEEN" (the
// times in Unix seconds). It was a JSON document until a 100-host `status --pool` with a few
// hundred readings spent a third of its time parsing and writing it with a DOM.
constexpr std::string_view kRecordHeader = "gpulock idle readings 1\n";

// A key or lease id the record can hold: printable ASCII without spaces. Others (a host name
// from another host's registration could hold anything) are not kept between runs.
bool is_record_field(std::string_view text) {
  return !text.empty() && text.size() <= 1024 &&
         std::all_of(text.begin(), text.end(), [](char c) { return c > ' ' && c < 127; });
}

// Unix seconds as the record holds them: from 0 to kLatestTime (the year 5138), which a
// reading of this machine's clock cannot leave.
constexpr double kLatestTime = 1e11;

std::optional<double> time_of(std::string_view text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || !(value >= 0) ||
      !(value <= kLatestTime))
    return std::nullopt;
  return value;
}

// Appends " SECONDS.MICROSECONDS", by integers: a double format with a precision costs ~1,000
// instructions, and a record holds two times per GPU.
void append_time(std::string& out, double seconds) {
  const auto micros =
      static_cast<std::uint64_t>(std::llround(std::clamp(seconds, 0.0, kLatestTime) * 1e6));
  char buffer[32];
  buffer[0] = ' ';
  char* end = std::to_chars(buffer + 1, buffer + sizeof buffer, micros / 1'000'000).ptr;
  *end++ = '.';
  const auto fraction = micros % 1'000'000;
  for (std::uint64_t unit = 100'000; unit > 0; unit /= 10)
    *end++ = static_cast<char>('0' + fraction / unit % 10);
  out.append(buffer, end);
}

std::string key_of(const PoolStatus& status, const GpuStatus& gpu) {
  return (gpu.host.empty() ? status.host : gpu.host) + "/" + gpu.device.uuid;
}

// The record's text, or "" when it is missing, not a regular file (a symlink, a FIFO, a
// device: never followed, never waited on), larger than kMaxRecordBytes, or unreadable.
std::string read_record(const std::filesystem::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  struct stat info {};
  if (!fd || ::fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode) ||
      info.st_size > static_cast<off_t>(kMaxRecordBytes))
    return {};
  // One byte more than the size: a file that grew meanwhile is not taken half read.
  std::string text(static_cast<std::size_t>(info.st_size) + 1, '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return {};
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  if (done == text.size()) return {};
  text.resize(done);
  return text;
}

}  // namespace

IdleTracker::IdleTracker(std::filesystem::path record) : record_(std::move(record)) {}

void IdleTracker::load() {
  readings_.clear();
  if (record_.empty()) return;
  const std::string text = read_record(record_);
  std::string_view rest(text);
  if (!rest.starts_with(kRecordHeader)) return;  // missing, damaged, or another format
  rest.remove_prefix(kRecordHeader.size());
  // A line that is not four good fields is skipped; the others still count.
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    std::string_view line = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    std::string_view fields[4];
    std::size_t n = 0;
    while (n < 4 && !line.empty()) {
      const std::size_t space = std::min(line.find(' '), line.size());
      fields[n++] = line.substr(0, space);
      line.remove_prefix(std::min(space + 1, line.size()));
    }
    if (n != 4 || !line.empty() || !is_record_field(fields[0]) || !is_record_field(fields[1]))
      continue;
    const auto zero_since = time_of(fields[2]);
    const auto last_seen = time_of(fields[3]);
    if (!zero_since || !last_seen) continue;
    readings_[std::string(fields[0])] = Reading{std::string(fields[1]), *zero_since, *last_seen};
  }
}

void IdleTracker::save() const {
  if (record_.empty()) return;
  std::string text(kRecordHeader);
  for (const auto& [key, r] : readings_)
    if (is_record_field(key) && is_record_field(r.lease_id)) {
      text += key;
      text += ' ';
      text += r.lease_id;
      append_time(text, r.zero_since);
      append_time(text, r.last_seen);
      text += '\n';
    }
  // Written beside the record and renamed over it, so a reader never sees half a file.
  std::error_code ignored;
  std::filesystem::create_directories(record_.parent_path(), ignored);
  // Appended in steps: g++ 12 at -O3 warns falsely (-Wrestrict) about "." + std::string&&.
  std::string temporary_name = ".";
  temporary_name += record_.filename().string();
  temporary_name += '.';
  temporary_name += make_lease_id();
  const std::filesystem::path temporary = record_.parent_path() / temporary_name;
  UniqueFd fd(
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) return;
  const bool written =
      ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
  fd.reset();
  if (!written || ::rename(temporary.c_str(), record_.c_str()) != 0) ::unlink(temporary.c_str());
}

void IdleTracker::observe(PoolStatus& status, std::chrono::seconds idle_after) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The record is a convenience: no trouble with it may stop a status from being shown.
  try {
    if (!record_.empty()) load();
  } catch (const std::exception&) {
    readings_.clear();
  }
  const double now = unix_seconds(status.taken_at);
  const double max_gap = std::chrono::duration<double>(kMaxReadingGap).count();
  // The readings are updated in place: each GPU of the status replaces its own (or drops it,
  // when it is not leased at 0 % now); those of GPUs the status did not cover (other hosts,
  // other pools) are kept while they are recent.
  for (auto& gpu : status.gpus) {
    gpu.idle_since.reset();
    gpu.idle = false;
    const std::string key = key_of(status, gpu);
    const auto before = readings_.find(key);
    std::optional<double> zero_since;
    if (gpu.state == GpuState::kLeased && gpu.holder) {
      if (gpu.device.idle_since) {
        zero_since = unix_seconds(*gpu.device.idle_since);
      } else if (gpu.device.utilization_percent && *gpu.device.utilization_percent == 0) {
        const bool unbroken =
            before != readings_.end() && before->second.lease_id == gpu.holder->lease_id &&
            now - before->second.last_seen <= max_gap && before->second.last_seen <= now;
        zero_since = unbroken ? before->second.zero_since : now;
      }
    }
    if (!zero_since) {  // free, busy, or utilisation unknown: no run of idle readings
      if (before != readings_.end()) readings_.erase(before);
      continue;
    }
    // Not before the lease began: idleness under an earlier lease is not this lease's.
    const double since = std::min(std::max(*zero_since, unix_seconds(gpu.holder->started_at)), now);
    readings_.insert_or_assign(before, key, Reading{gpu.holder->lease_id, since, now});
    gpu.idle_since = from_unix_seconds(since);
    gpu.idle = now - since >= std::chrono::duration<double>(idle_after).count();
  }
  status.idle_after = idle_after;
  // Kept 10 minutes (kMaxReadingGap); one "seen" later than now (the clock went back) not.
  std::erase_if(readings_, [&](const auto& entry) {
    return now - entry.second.last_seen > max_gap || entry.second.last_seen > now;
  });
  try {
    if (!record_.empty()) save();
  } catch (const std::exception&) {
    // not kept for the next run; this one is still right
  }
}

std::filesystem::path default_idle_record_path() {
  // Only under a directory of this user's own (or, where it does not exist yet, whose nearest
  // existing parent is): run through sudo, HOME may still name the invoking user's home, where
  // root would create root-owned directories the user then cannot write, and would follow
  // whatever symlinks that user planted there.
  const auto ours = [](std::filesystem::path directory) {
    for (;;) {
      struct stat info {};
      if (::stat(directory.c_str(), &info) == 0)
        return S_ISDIR(info.st_mode) && info.st_uid == ::geteuid();
      if (errno != ENOENT || directory == directory.parent_path()) return false;
      directory = directory.parent_path();
    }
  };
  const char* state = std::getenv("XDG_STATE_HOME");
  if (state != nullptr && *state == '/') {
    if (!ours(state)) return {};
    return std::filesystem::path(state) / "gpulock" / "idle-readings.txt";
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home == '/' && ours(home))
    return std::filesystem::path(home) / ".local" / "state" / "gpulock" / "idle-readings.txt";
  return {};
}

}  // namespace gpulock
