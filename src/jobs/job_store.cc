// JobStore: the jobs' directory shared by the machine's users, one directory per job.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpulock/config.hpp"
#include "gpulock/error.hpp"
#include "gpulock/jobs.hpp"
#include "jobs/job_state_file.h"
#include "local/gpu_lock_file.h"
#include "local/lock_directory.h"
#include "process/process_identity.h"
#include "util/fd.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using nlohmann::json;

constexpr const char* kSpecFile = "job.json";
// The state record of a job made by gpulock before the state file (jobs/job_state_file.h).
constexpr const char* kLegacyStateFile = "state.json";
// Longer reasons are cut, so that a record always fits its state file's slot.
constexpr std::size_t kMaxReasonBytes = 2048;
constexpr const char* kLockFile = "lock";
constexpr const char* kCancelFile = "cancel";
// A record larger than this is not one gpulock wrote: refused, never read whole.
constexpr std::size_t kMaxRecordBytes = 1 << 20;

constexpr struct {
  JobState state;
  const char* name;
} kStateNames[] = {
    {JobState::kHeld, "held"},           {JobState::kWaiting, "waiting"},
    {JobState::kRunning, "running"},     {JobState::kDependencyFailed, "dependency-failed"},
    {JobState::kDone, "done"},           {JobState::kFailed, "failed"},
    {JobState::kCancelled, "cancelled"}, {JobState::kTimeout, "timeout"},
    {JobState::kLost, "lost"},
};

[[noreturn]] void fail(ErrorCode code, const std::string& what, int error) {
  throw Error(code, errno_message(what, error));
}

std::optional<std::uint64_t> parse_id(std::string_view text) {
  std::uint64_t id = 0;
  if (text.empty() || text.size() > 19 || text.front() == '0') return std::nullopt;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return id;
}

// Writes `text` to `name` in the directory `dir_fd` through a temporary file and a rename, so
// that a reader sees the old record or the new one, never a part.
void replace_file(int dir_fd, const std::string& name, const std::string& text, mode_t mode) {
  const std::string temporary = "." + name + ".tmp";
  ::unlinkat(dir_fd, temporary.c_str(), 0);
  UniqueFd fd(::openat(dir_fd, temporary.c_str(),
                       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
  if (!fd) fail(ErrorCode::kEnvironment, "cannot write " + name, errno);
  const char* data = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd.get(), data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::unlinkat(dir_fd, temporary.c_str(), 0);
      fail(ErrorCode::kEnvironment, "cannot write " + name, error);
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fchmod(fd.get(), mode) != 0 ||
      ::renameat(dir_fd, temporary.c_str(), dir_fd, name.c_str()) != 0) {
    const int error = errno;
    ::unlinkat(dir_fd, temporary.c_str(), 0);
    fail(ErrorCode::kEnvironment, "cannot write " + name, error);
  }
}

// The whole of a small regular file (no symlink followed); throws with the reason otherwise.
std::string read_record(int dir_fd, const char* name) {
  UniqueFd fd(::openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) fail(ErrorCode::kEnvironment, fmt::format("cannot read {}", name), errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    throw Error(ErrorCode::kEnvironment, fmt::format("{} is not a regular file", name));
  if (static_cast<std::size_t>(st.st_size) > kMaxRecordBytes)
    throw Error(ErrorCode::kEnvironment, fmt::format("{} is too large to be a job record", name));
  return read_prefix(fd.get(), kMaxRecordBytes);
}

json spec_to_json(const JobSpec& spec) {
  return json{{"version", 1},
              {"name", spec.name},
              {"lease_options", spec.lease_options},
              {"command", spec.command},
              {"working_directory", spec.working_directory},
              {"submitted", spec.submitted_unix},
              {"after", spec.after},
              {"after_any", spec.after_any},
              {"begin", spec.begin_unix},
              {"array_index", spec.array_index ? json(*spec.array_index) : json(nullptr)},
              {"array_first", spec.array_first},
              {"array_position", spec.array_position},
              {"array_limit", spec.array_limit},
              {"resubmitted_from", spec.resubmitted_from}};
}

// A job's record is JSON, which holds text, not bytes: a command, name or directory that is not
// UTF-8 could not be run again as it was submitted, so it is refused before anything is made.
void check_spec_text(const JobSpec& spec) {
  const auto refuse = [](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} is not valid UTF-8: a job's command, name and working directory "
                            "must be (use `gpulock run` for other bytes)",
                            what));
  };
  for (std::size_t i = 0; i < spec.command.size(); ++i)
    if (!is_valid_utf8(spec.command[i]))
      refuse(i == 0 ? std::string("the program's name") : fmt::format("argument {}", i));
  if (!is_valid_utf8(spec.name)) refuse("the name");
  for (const auto& option : spec.lease_options)
    if (!is_valid_utf8(option))
      refuse(fmt::format("the option '{}'", sanitize_for_display(option)));
  if (!is_valid_utf8(spec.working_directory)) refuse("the working directory");
}

JobSpec spec_from_json(const json& j) {
  JobSpec spec;
  spec.name = j.at("name").get<std::string>();
  spec.lease_options = j.at("lease_options").get<std::vector<std::string>>();
  spec.command = j.at("command").get<std::vector<std::string>>();
  spec.working_directory = j.at("working_directory").get<std::string>();
  spec.submitted_unix = j.at("submitted").get<std::int64_t>();
  spec.after = j.value("after", std::vector<std::uint64_t>{});
  spec.after_any = j.value("after_any", std::vector<std::uint64_t>{});
  spec.begin_unix = j.value("begin", std::int64_t{0});
  if (j.contains("array_index") && !j.at("array_index").is_null())
    spec.array_index = j.at("array_index").get<std::int64_t>();
  spec.array_first = j.value("array_first", std::uint64_t{0});
  spec.array_position = j.value("array_position", std::uint64_t{0});
  spec.array_limit = j.value("array_limit", 0u);
  spec.resubmitted_from = j.value("resubmitted_from", std::uint64_t{0});
  if (spec.command.empty()) throw Error(ErrorCode::kEnvironment, "the job has no command");
  return spec;
}

json progress_to_json(const JobProgress& p) {
  json j{{"state", job_state_name(p.state)},
         {"supervisor_pid", p.supervisor_pid},
         {"started", p.started_unix},
         {"ended", p.ended_unix},
         {"lease_id", p.lease_id},
         {"gpus", p.gpus},
         {"reason", p.reason.size() <= kMaxReasonBytes
                        ? p.reason
                        : sanitize_for_display(p.reason, kMaxReasonBytes)}};
  j["exit_status"] = p.exit_status ? json(*p.exit_status) : json(nullptr);
  return j;
}

JobProgress progress_from_json(const json& j) {
  JobProgress p;
  const auto state = job_state_from_name(j.at("state").get<std::string>());
  if (!state) throw Error(ErrorCode::kEnvironment, "the job's state names no known state");
  p.state = *state;
  p.supervisor_pid = j.at("supervisor_pid").get<pid_t>();
  p.started_unix = j.at("started").get<std::int64_t>();
  p.ended_unix = j.at("ended").get<std::int64_t>();
  p.lease_id = j.at("lease_id").get<std::string>();
  p.gpus = j.at("gpus").get<std::vector<std::string>>();
  if (!j.at("exit_status").is_null()) p.exit_status = j.at("exit_status").get<int>();
  p.reason = j.at("reason").get<std::string>();
  return p;
}

std::string progress_text(const JobProgress& p) {
  return progress_to_json(p).dump(-1, ' ', false, json::error_handler_t::replace);
}

// The job's state record; from the file of an earlier gpulock where the job has no other.
std::string read_state(int dir_fd) {
  struct stat st {};
  if (::fstatat(dir_fd, kJobStateFile, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT &&
      ::fstatat(dir_fd, kLegacyStateFile, &st, AT_SYMLINK_NOFOLLOW) == 0)
    return read_record(dir_fd, kLegacyStateFile);
  return read_job_state(dir_fd);
}

UniqueFd open_directory(int at, const char* name) {
  return UniqueFd(::openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

UniqueFd open_root(const std::filesystem::path& root) {
  UniqueFd fd = open_directory(AT_FDCWD, root.c_str());
  if (!fd) fail(ErrorCode::kEnvironment, "cannot open " + root.string(), errno);
  return fd;
}

// Takes a lock of `type` on the whole file, asleep in the kernel's queue until it is granted.
// `interrupted` is asked before each sleep (a signal that came before the first would not cut it
// short) and after each signal; Error(kInterrupted) once it says so.
void wait_for_lock(int fd, short type, const std::function<bool()>& interrupted,
                   const std::string& what) {
  struct flock request {};
  request.l_type = type;
  request.l_whence = SEEK_SET;
  while (!(interrupted && interrupted()) && ::fcntl(fd, F_OFD_SETLKW, &request) != 0)
    if (errno != EINTR) fail(ErrorCode::kInternal, "fcntl(F_OFD_SETLKW)", errno);
  if (interrupted && interrupted())
    throw Error(ErrorCode::kInterrupted, "interrupted while waiting for " + what);
}

// Whether the job's supervisor still holds its lock (the lock file read-only: any user can ask).
// Only a write lock counts: anyone may read-lock the file (`gpulock wait` does), and a read lock
// kept after the supervisor died must not make the job look alive.
bool supervisor_alive(int job_fd) {
  UniqueFd lock(::openat(job_fd, kLockFile, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!lock) return false;
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  while (::fcntl(lock.get(), F_OFD_GETLK, &probe) != 0)
    if (errno != EINTR) return false;
  return probe.l_type == F_WRLCK;
}

// Reads job `name` in the store; `problem` set where its record cannot be read.
JobInfo read_job(int root_fd, const std::filesystem::path& root, std::uint64_t id) {
  JobInfo info;
  info.id = id;
  const std::string name = std::to_string(id);
  info.directory = root / name;
  UniqueFd dir = open_directory(root_fd, name.c_str());
  if (!dir) {
    info.problem = errno == ELOOP || errno == ENOTDIR ? "not a directory (a symlink?)"
                                                      : errno_message("cannot open", errno);
    struct stat st {};
    if (::fstatat(root_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) info.owner = st.st_uid;
    info.owner_name = user_name(info.owner);
    return info;
  }
  struct stat st {};
  ::fstat(dir.get(), &st);
  info.owner = st.st_uid;
  info.owner_name = user_name(st.st_uid);
  try {
    info.spec = spec_from_json(json::parse(read_record(dir.get(), kSpecFile)));
    // The lock first, then the state: a supervisor records the job's end before its lock goes,
    // so a state read after the lock was seen free is the last one it wrote.
    const bool alive = supervisor_alive(dir.get());
    info.progress = progress_from_json(json::parse(read_state(dir.get())));
    if (!alive && !job_state_is_final(info.progress.state)) {
      info.progress.state = JobState::kLost;
      info.progress.reason = "its supervisor ended without recording an end (killed, OOM, reboot)";
    }
  } catch (const json::exception& e) {
    info.problem = fmt::format("a malformed record: {}", e.what());
  } catch (const Error& e) {
    info.problem = e.what();
  }
  return info;
}

constexpr std::uint64_t kMaxJobId = 1'000'000'000'000'000'000ULL;
constexpr std::string_view kMarkPrefix = ".last-id-";

// The highest id in the users' marks (.last-id-UID, each written by its user only).
std::uint64_t highest_marked(int root_fd) {
  std::uint64_t highest = 0;
  const int copy = ::fcntl(root_fd, F_DUPFD_CLOEXEC, 3);
  DIR* dir = copy < 0 ? nullptr : ::fdopendir(copy);
  if (!dir) {
    if (copy >= 0) ::close(copy);
    return 0;
  }
  ::rewinddir(dir);  // a duplicate shares the offset of the descriptor it copies
  while (const dirent* entry = ::readdir(dir)) {
    if (std::string_view(entry->d_name).substr(0, kMarkPrefix.size()) != kMarkPrefix) continue;
    try {
      if (const auto id = parse_id(read_record(root_fd, entry->d_name)))
        highest = std::max(highest, std::min(*id, kMaxJobId));
    } catch (const Error&) {
      // unreadable or odd: not a mark
    }
  }
  ::closedir(dir);
  return highest;
}

// This user's mark, best effort (a full disk only risks an id given again after a clean).
void mark_highest(int root_fd, std::uint64_t id) {
  try {
    replace_file(root_fd, std::string(kMarkPrefix) + std::to_string(::geteuid()),
                 std::to_string(id), 0644);
  } catch (const Error&) {
  }
}

std::vector<std::uint64_t> job_ids(int root_fd) {
  std::vector<std::uint64_t> ids;
  const int copy = ::fcntl(root_fd, F_DUPFD_CLOEXEC, 3);
  if (copy < 0) fail(ErrorCode::kEnvironment, "cannot list the jobs", errno);
  DIR* dir = ::fdopendir(copy);
  if (!dir) {
    ::close(copy);
    fail(ErrorCode::kEnvironment, "cannot list the jobs", errno);
  }
  ::rewinddir(dir);  // a duplicate shares the offset of the descriptor it copies
  while (const dirent* entry = ::readdir(dir))
    if (const auto id = parse_id(entry->d_name)) ids.push_back(*id);
  ::closedir(dir);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

const char* job_state_name(JobState state) {
  for (const auto& s : kStateNames)
    if (s.state == state) return s.name;
  return "unknown";
}

std::optional<JobState> job_state_from_name(const std::string& name) {
  for (const auto& s : kStateNames)
    if (name == s.name) return s.state;
  return std::nullopt;
}

bool job_state_is_final(JobState state) {
  return state != JobState::kHeld && state != JobState::kWaiting && state != JobState::kRunning;
}

std::filesystem::path default_jobs_directory() {
  if (const char* dir = std::getenv("GPULOCK_JOBS_DIR"); dir && *dir) return dir;
  return default_jobs_directory(load_config());
}

std::filesystem::path default_jobs_directory(const Config& config) {
  if (const char* dir = std::getenv("GPULOCK_JOBS_DIR"); dir && *dir) return dir;
  if (!config.jobs_dir.empty()) return config.jobs_dir;
  if (const char* dir = std::getenv("GPULOCK_DIR"); dir && *dir)
    return std::filesystem::path(dir) / "jobs";
  return "/var/tmp/gpulock-jobs";
}

JobStore JobStore::open(const std::filesystem::path& root) {
  // A lock directory not made yet (GPULOCK_DIR's jobs): made as gpulock makes one, shared.
  const std::filesystem::path parent = root.parent_path();
  if (!parent.empty() && ::mkdir(parent.c_str(), 01777) == 0) ::chmod(parent.c_str(), 01777);
  if (::mkdir(root.c_str(), 01777) == 0) {
    // mkdir's mode goes through the umask, and the sticky bit must be set by hand.
    ::chmod(root.c_str(), 01777);
  } else if (errno != EEXIST) {
    fail(ErrorCode::kEnvironment, fmt::format("cannot create the jobs directory {}", root.string()),
         errno);
  }
  UniqueFd fd = open_directory(AT_FDCWD, root.c_str());
  if (!fd)
    fail(ErrorCode::kEnvironment,
         fmt::format("cannot open the jobs directory {} (a symlink, or not a directory?)",
                     root.string()),
         errno);
  struct stat st {};
  ::fstat(fd.get(), &st);
  if (st.st_uid != ::geteuid() && st.st_uid != 0 && (st.st_mode & 01002) != 01002)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("the jobs directory {} belongs to {} and is not shared (mode {:o}, "
                            "not 1777): set GPULOCK_JOBS_DIR, or ask them or an administrator",
                            root.string(), user_name(st.st_uid), st.st_mode & 07777));
  if ((st.st_mode & 0002) && !(st.st_mode & 01000))
    throw Error(ErrorCode::kEnvironment,
                fmt::format("the jobs directory {} is writable by everyone but not sticky: anyone "
                            "could remove anyone's jobs (chmod 1777 it)",
                            root.string()));
  return JobStore(root);
}

JobStore::Created JobStore::create(const JobSpec& spec, bool logs_readable_by_all) const {
  check_spec_text(spec);
  UniqueFd root_fd = open_root(root_);
  const std::vector<std::uint64_t> ids = job_ids(root_fd.get());
  // After the highest job in the store, and after the highest any user has had (their marks
  // outlive `jobs --clean`, so that an id is never given twice).
  std::uint64_t id = std::max(ids.empty() ? 0 : ids.back(), highest_marked(root_fd.get())) + 1;
  if (id > kMaxJobId)
    throw Error(ErrorCode::kEnvironment,
                fmt::format("no job id left in {}: an entry or mark there is numbered beyond {} "
                            "(remove it)",
                            root_.string(), kMaxJobId));
  // mkdir is the allocation: two submits at once cannot both make the same directory.
  while (::mkdirat(root_fd.get(), std::to_string(id).c_str(), 0755) != 0) {
    if (errno != EEXIST)
      fail(ErrorCode::kEnvironment, fmt::format("cannot create a job in {}", root_.string()),
           errno);
    ++id;
  }
  const std::string name = std::to_string(id);
  Created created{id, root_ / name, -1};
  mark_highest(root_fd.get(), id);
  UniqueFd dir = open_directory(root_fd.get(), name.c_str());
  if (!dir) fail(ErrorCode::kEnvironment, "cannot open " + created.directory.string(), errno);
  ::fchmod(dir.get(), 0755);  // past the umask: others may read its state (`jobs --all`)
  try {
    UniqueFd lock(
        ::openat(dir.get(), kLockFile, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!lock || !try_lock_exclusive(lock.get()))
      fail(ErrorCode::kEnvironment, "cannot lock the new job's lock file", errno);
    ::fchmod(lock.get(), 0644);
    const mode_t log_mode = logs_readable_by_all ? 0644 : 0600;
    for (const char* log : {"stdout", "stderr"}) {
      UniqueFd out(
          ::openat(dir.get(), log, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, log_mode));
      if (!out)
        fail(ErrorCode::kEnvironment, fmt::format("cannot create the job's {}", log), errno);
      ::fchmod(out.get(), log_mode);
    }
    JobProgress initial;
    if (!spec.after.empty() || !spec.after_any.empty() || spec.begin_unix != 0 ||
        spec.array_limit != 0)
      initial.state = JobState::kHeld;
    create_job_state(dir.get(), progress_text(initial));
    replace_file(dir.get(), kSpecFile,
                 spec_to_json(spec).dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                 0644);
    created.lock_fd = lock.release();
  } catch (const Error& e) {
    // Half made: gone again, so that no half record stays behind (a full disk, say).
    std::error_code ignored;
    std::filesystem::remove_all(created.directory, ignored);
    throw Error(e.code(), fmt::format("cannot make a job in {}: {}", root_.string(), e.what()));
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(created.directory, ignored);
    throw;
  }
  return created;
}

void JobStore::create_array_slots(std::uint64_t first, unsigned limit) const {
  const auto directory = root_ / std::to_string(first);
  UniqueFd dir = open_directory(AT_FDCWD, directory.c_str());
  if (!dir) fail(ErrorCode::kEnvironment, "cannot open " + directory.string(), errno);
  for (unsigned slot = 0; slot < limit; ++slot) {
    const std::string name = fmt::format("slot-{}", slot);
    UniqueFd fd(::openat(dir.get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) fail(ErrorCode::kEnvironment, "cannot create the array's " + name, errno);
  }
}

std::vector<JobInfo> JobStore::list() const {
  UniqueFd root_fd = open_root(root_);
  std::vector<JobInfo> jobs;
  for (const std::uint64_t id : job_ids(root_fd.get()))
    jobs.push_back(read_job(root_fd.get(), root_, id));
  return jobs;
}

std::optional<JobInfo> JobStore::find(std::uint64_t id) const {
  UniqueFd root_fd = open_root(root_);
  struct stat st {};
  if (::fstatat(root_fd.get(), std::to_string(id).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return std::nullopt;
  return read_job(root_fd.get(), root_, id);
}

JobInfo JobStore::wait(std::uint64_t id, const std::function<bool()>& interrupted) const {
  const auto job = find(id);
  if (!job) throw Error(ErrorCode::kNotFound, fmt::format("no job {}", id));
  if (!job->problem.empty() || job_state_is_final(job->progress.state)) return *job;
  UniqueFd lock(
      ::open((job->directory / kLockFile).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!lock) fail(ErrorCode::kEnvironment, fmt::format("cannot open job {}'s lock", id), errno);
  // A read lock, granted once the supervisor's write lock is gone; let go at once.
  wait_for_lock(lock.get(), F_RDLCK, interrupted, fmt::format("job {}", id));
  unlock(lock.get());
  const auto ended = find(id);
  if (!ended) throw Error(ErrorCode::kNotFound, fmt::format("job {} was removed", id));
  return *ended;
}

void JobStore::cancel(std::uint64_t id) const {
  auto job = find(id);
  if (!job) throw Error(ErrorCode::kNotFound, fmt::format("no job {}", id));
  if (job->problem.empty() && job_state_is_final(job->progress.state))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("job {} has ended ({})", id, job_state_name(job->progress.state)));
  UniqueFd dir = open_directory(AT_FDCWD, job->directory.c_str());
  if (!dir) fail(ErrorCode::kEnvironment, fmt::format("cannot open job {}", id), errno);
  // The mark: only the job's owner (or root) can create a file in its directory.
  UniqueFd mark(::openat(dir.get(), kCancelFile,
                         O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (!mark) {
    if (errno == EACCES || errno == EPERM)
      throw Error(ErrorCode::kPermissionDenied,
                  fmt::format("job {} belongs to {}: only they or root can cancel it", id,
                              job->owner_name));
    fail(ErrorCode::kEnvironment, fmt::format("cannot cancel job {}", id), errno);
  }
  // A running job's supervisor sees the mark within a second and stops the command itself
  // (one SIGTERM, then SIGKILL). One that waits is woken by SIGTERM, and cancel returns once it
  // has ended. The pid is believed only through a pidfd opened while the job's lock is held: a
  // pid named by the state of a supervisor that died may be someone else's by now. The state is
  // read again now that the mark is there: a supervisor records its pid before it looks for the
  // mark, so either it sees the mark or this sees its pid.
  // A supervisor asleep in the kernel's lock queue (--after, an array's slot) cannot be woken
  // by a SIGTERM that landed just before it went to sleep: the signal is sent again until the
  // supervisor has gone (its pidfd becomes readable), for a few seconds, unless its command has
  // started meanwhile (then it has seen the mark, and the command gets one SIGTERM).
  UniqueFd pidfd;
  for (int round = 0; round < 60; ++round) {
    const auto now = find(id);
    if (!now || !now->problem.empty() || now->progress.state == JobState::kRunning ||
        job_state_is_final(now->progress.state))
      return;  // lost, too, is final
    if (!pidfd && now->progress.supervisor_pid > 0) {
      pidfd = UniqueFd(open_pidfd(now->progress.supervisor_pid));
      const auto owner = process_uid(now->progress.supervisor_pid);
      if (!pidfd || !supervisor_alive(dir.get()) || !owner || *owner != now->owner) return;
    }
    if (!pidfd) {
      ::poll(nullptr, 0, 50);  // its supervisor has not said who it is yet; it will see the mark
      continue;
    }
#ifdef SYS_pidfd_send_signal
    if (::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGTERM, nullptr, 0) != 0) {
      if (errno == EPERM)
        throw Error(ErrorCode::kPermissionDenied,
                    fmt::format("job {} belongs to {}: only they or root can cancel it", id,
                                now->owner_name));
      return;  // ESRCH: it has gone
    }
#else
    return;
#endif
    pollfd ended{pidfd.get(), POLLIN, 0};
    if (::poll(&ended, 1, 50) != 0) return;
  }
}

std::size_t JobStore::clean() const {
  std::size_t removed = 0;
  const uid_t me = ::geteuid();
  const auto now = std::chrono::system_clock::now();
  for (const JobInfo& job : list()) {
    // Root removes other users' ended jobs, but never what they planted: only records that read.
    if (job.owner != me && (me != 0 || !job.problem.empty())) continue;
    if (job.problem.empty() && !job_state_is_final(job.progress.state)) continue;
    if (!job.problem.empty()) {
      // Unreadable: maybe one being made this moment, or one whose supervisor still runs.
      struct stat st {};
      if (::lstat(job.directory.c_str(), &st) == 0 &&
          now - std::chrono::system_clock::from_time_t(st.st_mtime) < std::chrono::minutes(1))
        continue;
      UniqueFd dir = open_directory(AT_FDCWD, job.directory.c_str());
      if (dir && supervisor_alive(dir.get())) continue;
    }
    std::error_code error;
    std::filesystem::remove_all(job.directory, error);
    if (!error) ++removed;
  }
  return removed;
}

void write_job_progress(const std::filesystem::path& directory, const JobProgress& progress) {
  UniqueFd dir = open_directory(AT_FDCWD, directory.c_str());
  if (!dir) fail(ErrorCode::kEnvironment, "cannot open " + directory.string(), errno);
  write_job_state(dir.get(), progress_text(progress));
}

void take_array_slot(const JobStore& store, const JobInfo& job,
                     const std::function<bool()>& interrupted) {
  const JobSpec& spec = job.spec;
  // Kept open until this process ends: the slot is this job's while it lives.
  static std::vector<UniqueFd> slots;
  const auto directory =
      store.root() / std::to_string(spec.array_first != 0 ? spec.array_first : job.id);
  for (unsigned slot = 0; slot < spec.array_limit; ++slot) {
    const auto path = directory / fmt::format("slot-{}", slot);
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) fail(ErrorCode::kEnvironment, "cannot open the array's " + path.string(), errno);
    slots.push_back(std::move(fd));
  }
  // Any free slot; else the one this job's place falls on, waited for in the kernel's queue.
  for (auto it = slots.begin(); it != slots.end(); ++it) {
    if (try_lock_exclusive(it->get())) {
      UniqueFd mine = std::move(*it);
      slots.clear();
      slots.push_back(std::move(mine));
      return;
    }
  }
  UniqueFd& mine = slots[spec.array_position % slots.size()];
  wait_for_lock(mine.get(), F_WRLCK, interrupted, "a slot of its array");
  UniqueFd kept = std::move(mine);
  slots.clear();
  slots.push_back(std::move(kept));
}

bool job_cancel_requested(const std::filesystem::path& directory) {
  struct stat st {};
  return ::lstat((directory / kCancelFile).c_str(), &st) == 0;
}

}  // namespace gpulock
