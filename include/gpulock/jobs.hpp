// Jobs: commands submitted to run later under a lease (`gpulock submit`), each kept by a
// supervisor process of its own, and their records in a store shared by the machine's users.
//
// The store is one directory (default_jobs_directory()), sticky and writable by everyone, as
// /tmp is. Each job is a directory in it named by its number and owned by the user who submitted
// it: only that user (and root) can change or remove it, which the kernel enforces. A job's
// directory holds its spec (job.json, written once), its state (state.json, replaced whole at
// each step), its output (stdout, stderr) and a lock file that its supervisor holds for as long
// as it lives. A job whose state says it has not ended but whose lock nobody holds has lost its
// supervisor (killed, OOM, reboot): it is `lost`, never `running` for ever.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpulock {

struct Config;

enum class JobState {
  kHeld,              // its supervisor waits for the jobs it depends on, or for its --begin time
  kWaiting,           // its supervisor waits in the queue for GPUs
  kRunning,           // the command runs
  kDone,              // the command exited 0
  kFailed,            // the command exited non-zero or was killed by a signal
  kCancelled,         // `gpulock cancel`, waiting or running
  kTimeout,           // it ran past its --time and was stopped
  kLost,              // its supervisor died without recording an end (SIGKILL, OOM, reboot)
  kDependencyFailed,  // a job it runs --after did not end `done`: it never ran
};
const char* job_state_name(JobState state);
// The state named `name` ("waiting", …); nullopt for anything else.
std::optional<JobState> job_state_from_name(const std::string& name);
bool job_state_is_final(JobState state);

// The label of a job's lease: "job 56", or "job 56 NAME" with the job's name or --label, so
// that every view of leases (status, queue, dashboard, metrics, journal) names the job.
std::string job_lease_label(const std::string& job_id, const std::string& label);
// The job id a lease label names ("56" for "job 56 …"); "" for a label of no job. The label is
// the holder's word: a `gpulock run --label "job 56"` reads as job 56 too.
std::string job_of_lease_label(std::string_view label);

// What `gpulock submit` records once: what to run, where, and how to lease its GPUs.
struct JobSpec {
  std::string name;                        // --name; "" for none
  std::vector<std::string> lease_options;  // `gpulock run`'s options, as given
  std::vector<std::string> command;        // the command and its arguments
  std::string working_directory;
  std::int64_t submitted_unix = 0;       // seconds
  std::vector<std::uint64_t> after;      // runs once these ended `done` (--after)
  std::vector<std::uint64_t> after_any;  // runs once these ended at all (--after-any)
  std::int64_t begin_unix = 0;           // not before this time (--begin); 0: at once
  // A job of an array (--array): its index, the array's first job (whose directory has the
  // array's slot files; 0 in the first job itself), its place in the array, and how many may
  // run at once (0: no limit).
  std::optional<std::int64_t> array_index;
  std::uint64_t array_first = 0;
  std::uint64_t array_position = 0;
  unsigned array_limit = 0;
  std::uint64_t resubmitted_from = 0;  // `gpulock resubmit`: the job this one repeats (0: none)
};

// What a job's supervisor records as it goes.
struct JobProgress {
  JobState state = JobState::kWaiting;
  pid_t supervisor_pid = 0;
  std::int64_t started_unix = 0;  // the command started (0: not yet)
  std::int64_t ended_unix = 0;    // the job ended (0: not yet)
  std::string lease_id;
  std::vector<std::string> gpus;   // display indices
  std::optional<int> exit_status;  // the command's exit status (128+N for signal N)
  std::string reason;              // why it ended, in words
};

// A job as the store shows it: its spec, its progress, and who owns it.
struct JobInfo {
  std::uint64_t id = 0;
  uid_t owner = 0;
  std::string owner_name;
  std::filesystem::path directory;
  JobSpec spec;
  JobProgress progress;  // state kLost where the supervisor is gone without an end
  std::string problem;   // a record that cannot be read: why (spec and progress then empty)
};

// `gpulock jobs --json`: {"jobs": [...]}, each job as docs/jobs.md describes it.
std::string jobs_to_json(const std::vector<JobInfo>& jobs);

// GPULOCK_JOBS_DIR; else the config's jobs_dir; else, where GPULOCK_DIR is set, its `jobs`
// directory; else /var/tmp/gpulock-jobs (kept across reboots, so that a job a reboot ended shows
// as lost instead of vanishing). Throws Error(kConfig) for an invalid config file.
std::filesystem::path default_jobs_directory();
// The same from a config already read.
std::filesystem::path default_jobs_directory(const Config& config);

class JobStore {
 public:
  // Opens the store at `root`, creating it (mode 1777) if missing. Throws Error with a clear
  // message if it is a symlink, not a directory, or not usable by the caller.
  static JobStore open(const std::filesystem::path& root);

  const std::filesystem::path& root() const { return root_; }

  // A new job: its directory (owned by the caller), its spec, its output files and its lock,
  // taken. Returns the job and the descriptor of its locked lock file, which the supervisor
  // must inherit (the lock is held without a gap from here to the supervisor's end).
  struct Created {
    std::uint64_t id = 0;
    std::filesystem::path directory;
    int lock_fd = -1;  // owned by the caller
  };
  Created create(const JobSpec& spec, bool logs_readable_by_all) const;
  // The `limit` slot files of an array whose first job is `first` (in that job's directory).
  void create_array_slots(std::uint64_t first, unsigned limit) const;

  // Every job in the store, by id; records that cannot be read come back with `problem` set.
  std::vector<JobInfo> list() const;
  // One job; nullopt if there is no job `id`.
  std::optional<JobInfo> find(std::uint64_t id) const;

  // Waits (asleep, in the kernel's lock queue) until job `id`'s supervisor has ended, then
  // returns the job as it ended. `interrupted`, when set, is asked after each signal that
  // interrupts the wait; Error(kInterrupted) once it says so.
  JobInfo wait(std::uint64_t id, const std::function<bool()>& interrupted = {}) const;

  // Asks job `id` to stop: marks it cancelled (a file only its owner or root can create), then
  // sends its supervisor SIGTERM. Throws Error(kPermissionDenied) for another user's job, and
  // Error(kInvalidArgument) for one that has ended.
  void cancel(std::uint64_t id) const;

  // Removes the records of ended jobs (the caller's; every user's for root). Returns how many.
  std::size_t clean() const;

 private:
  explicit JobStore(std::filesystem::path root) : root_(std::move(root)) {}
  std::filesystem::path root_;
};

// Starts the supervisor of a job just created: `program` with `argv` (argv[0] first), in a new
// session with no terminal, stdin on /dev/null and stdout/stderr on the job's log files, holding
// the job's lock as descriptor 3 (the supervisor is told so on its command line). It survives
// the caller's terminal and session. Returns once the program has started (execve succeeded);
// throws Error if it could not be, after recording the job as failed. Closes `job.lock_fd`.
void launch_job(JobStore::Created& job, const std::string& program,
                const std::vector<std::string>& argv);

// In a job's supervisor, before it starts the command: points standard output and error (the
// job's log files) at pipes to a relay process that appends what comes through to those files,
// each up to `cap_bytes` (the config's job_log_size); past it output is read and dropped, and
// one line says so. The relay ignores the signals of a cancel and ends when every writer (this
// process and the command's) has closed; it holds no other descriptor. 0 = no cap: nothing is
// done, the command writes to the files itself. Throws Error(kEnvironment) if it cannot start.
void start_job_log_relay(std::uint64_t cap_bytes);

// Used by a job's supervisor (the hidden `gpulock run --job`): replaces the job's state file.
void write_job_progress(const std::filesystem::path& directory, const JobProgress& progress);
// True if the job in `directory` has been cancelled (its cancel mark exists).
bool job_cancel_requested(const std::filesystem::path& directory);

// Used by the supervisor of an array job with a limit: takes one of the array's slots (a lock
// file), waiting asleep for one if all are taken, and keeps it for the rest of this process's
// life. Throws Error(kInterrupted) once `interrupted` says so after a signal.
void take_array_slot(const JobStore& store, const JobInfo& job,
                     const std::function<bool()>& interrupted);

}  // namespace gpulock
