// IdleTracker (gpulock/monitor.hpp): how long each leased GPU has read 0 % utilisation, from
// readings kept across runs in a per-user JSON file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "gpulock/monitor.hpp"
#include "util/fd.h"
#include "util/random_id.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

constexpr std::size_t kMaxRecordBytes = 1024 * 1024;

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
  const auto document = nlohmann::json::parse(read_record(record_), nullptr, false);
  if (!document.is_object() || !document.contains("gpus") || !document["gpus"].is_object())
    return;  // missing or damaged: start again from no readings
  for (const auto& [key, entry] : document["gpus"].items()) {
    if (!entry.is_object() || !entry.value("lease_id", nlohmann::json()).is_string() ||
        !entry.value("zero_since", nlohmann::json()).is_number() ||
        !entry.value("last_seen", nlohmann::json()).is_number())
      continue;
    readings_[key] = Reading{entry["lease_id"].get<std::string>(),
                             entry["zero_since"].get<double>(), entry["last_seen"].get<double>()};
  }
}

void IdleTracker::save() const {
  if (record_.empty()) return;
  nlohmann::json gpus = nlohmann::json::object();
  for (const auto& [key, r] : readings_)
    gpus[key] = {
        {"lease_id", r.lease_id}, {"zero_since", r.zero_since}, {"last_seen", r.last_seen}};
  const std::string text = nlohmann::json{{"version", 1}, {"gpus", gpus}}.dump(
                               -1, ' ', false, nlohmann::json::error_handler_t::replace) +
                           "\n";
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
  std::map<std::string, Reading> seen;
  for (auto& gpu : status.gpus) {
    gpu.idle_since.reset();
    gpu.idle = false;
    if (gpu.state != GpuState::kLeased || !gpu.holder) continue;
    const std::string key = key_of(status, gpu);
    const std::string& lease_id = gpu.holder->lease_id;
    double zero_since = 0;
    if (gpu.device.idle_since) {
      zero_since = unix_seconds(*gpu.device.idle_since);
    } else if (gpu.device.utilization_percent && *gpu.device.utilization_percent == 0) {
      const auto before = readings_.find(key);
      const bool unbroken = before != readings_.end() && before->second.lease_id == lease_id &&
                            now - before->second.last_seen <= max_gap &&
                            before->second.last_seen <= now;
      zero_since = unbroken ? before->second.zero_since : now;
    } else {
      continue;  // busy, or utilisation unknown: no run of idle readings
    }
    // Not before the lease began: idleness under an earlier lease is not this lease's.
    zero_since = std::max(zero_since, unix_seconds(gpu.holder->started_at));
    zero_since = std::min(zero_since, now);
    seen[key] = Reading{lease_id, zero_since, now};
    gpu.idle_since = from_unix_seconds(zero_since);
    gpu.idle = now - zero_since >= std::chrono::duration<double>(idle_after).count();
  }
  status.idle_after = idle_after;
  // Readings of other hosts' GPUs that this status did not cover are kept.
  for (auto& [key, reading] : readings_)
    if (seen.count(key) == 0 && now - reading.last_seen <= max_gap) {
      bool covered = false;
      for (const auto& gpu : status.gpus) covered = covered || key_of(status, gpu) == key;
      if (!covered) seen.emplace(key, reading);
    }
  readings_ = std::move(seen);
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
    return std::filesystem::path(state) / "gpulock" / "idle-readings.json";
  }
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home == '/' && ours(home))
    return std::filesystem::path(home) / ".local" / "state" / "gpulock" / "idle-readings.json";
  return {};
}

}  // namespace gpulock
