// `gpulock run [selection] [waiting] -- CMD [ARGS…]`: lease GPUs, run a command on them; with
// the hidden --job, as the supervisor of a job that `gpulock submit` made.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <time.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

std::atomic<bool> stop_asked{false};
// A job's self-pipe: the handler writes to it, so that a wait for GPUs wakes even when the
// signal lands just before its sleep (WaitHooks::interrupt_fd). -1 outside a job.
int stop_pipe[2] = {-1, -1};
void ask_to_stop(int) {
  stop_asked.store(true);
  if (stop_pipe[1] >= 0) {
    const int saved = errno;
    [[maybe_unused]] const ssize_t n = ::write(stop_pipe[1], "x", 1);  // full: already readable
    errno = saved;
  }
}

// How a run ended, in the job's words.
void record_end(const std::string& job_dir, JobProgress& progress, int status, bool timed_out) {
  progress.ended_unix = unix_now();
  progress.exit_status = status;
  if (status != 0 && job_cancel_requested(job_dir)) {  // a cancel after a clean exit: done
    progress.state = JobState::kCancelled;
    progress.reason = "cancelled";
  } else if (timed_out) {
    progress.state = JobState::kTimeout;
    progress.reason = "stopped at its time limit";
  } else if (status == 0) {
    progress.state = JobState::kDone;
    progress.reason = "exited 0";
  } else {
    progress.state = JobState::kFailed;
    progress.reason = status > 128 ? fmt::format("killed by signal {}", status - 128)
                                   : fmt::format("exited {}", status);
  }
  write_job_progress(job_dir, progress);
}

// Sleeps until the wall clock reads `when`, until the clock is set (a later time may then have
// come, or not yet), or until a SIGTERM (the self-pipe): no wake-up before then.
void sleep_until_unix(std::int64_t when) {
  const int timer = ::timerfd_create(CLOCK_REALTIME, TFD_CLOEXEC);
  itimerspec at{};
  at.it_value.tv_sec = static_cast<time_t>(when);
  const bool armed =
      timer >= 0 &&
      ::timerfd_settime(timer, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &at, nullptr) == 0;
  pollfd waits[2] = {{armed ? timer : -1, POLLIN, 0}, {stop_pipe[0], POLLIN, 0}};
  // Without the timer, or without the pipe (a SIGTERM just before the poll would be missed),
  // a second at most.
  ::poll(waits, 2, armed && stop_pipe[0] >= 0 ? -1 : 1000);
  if (timer >= 0) ::close(timer);
}

// A job's wait before the queue: for the jobs it runs after, then for its --begin time (state
// `held`). False if it must not run: a job it runs --after did not end `done` (the job ends
// `dependency-failed`, exit 1). Throws Error(kInterrupted) on a cancel.
bool wait_for_dependencies(const std::string& job_dir, JobProgress& progress, int* exit_status) {
  const std::filesystem::path directory(job_dir);
  const JobStore store = JobStore::open(directory.parent_path());
  const auto self = store.find(std::stoull(directory.filename().string()));
  if (!self || !self->problem.empty())
    throw Error(ErrorCode::kEnvironment,
                "cannot read the job's own record" + (self ? ": " + self->problem : ""));
  const JobSpec& spec = self->spec;
  // A cancel: SIGTERM, or the mark alone (made before this process had said who it is).
  const auto stop = [&job_dir] { return stop_asked.load() || job_cancel_requested(job_dir); };
  if (!spec.after.empty() || !spec.after_any.empty() || spec.begin_unix != 0 ||
      spec.array_limit != 0) {
    progress.state = JobState::kHeld;
    write_job_progress(job_dir, progress);
    if (stop()) throw Error(ErrorCode::kInterrupted, "cancelled");
  }
  ::setenv("GPULOCK_JOB_ID", std::to_string(self->id).c_str(), 1);
  if (spec.array_index)
    ::setenv("GPULOCK_ARRAY_INDEX", std::to_string(*spec.array_index).c_str(), 1);
  for (const std::uint64_t id : spec.after) {
    std::string failure;
    try {
      const JobInfo parent = store.wait(id, stop);
      if (!parent.problem.empty())
        failure = fmt::format("job {} cannot be read: {}", id, parent.problem);
      else if (parent.progress.state != JobState::kDone)
        failure = fmt::format("job {} ended {}", id, job_state_name(parent.progress.state));
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kInterrupted) throw;
      failure = e.what();
    }
    if (!failure.empty()) {
      progress.state = JobState::kDependencyFailed;
      progress.ended_unix = unix_now();
      progress.reason = failure + " (--after)";
      write_job_progress(job_dir, progress);
      print_error("not run: " + progress.reason);
      *exit_status = 1;
      return false;
    }
  }
  for (const std::uint64_t id : spec.after_any) {
    try {
      store.wait(id, stop);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound) throw;  // removed (jobs --clean): it has ended
    }
  }
  while (spec.begin_unix != 0 && unix_now() < spec.begin_unix) {
    if (stop())
      throw Error(ErrorCode::kInterrupted, "cancelled while waiting for its --begin time");
    sleep_until_unix(spec.begin_unix);
  }
  // An array's limit (%K) last: a slot is taken only by a job ready to queue.
  if (spec.array_limit != 0) take_array_slot(store, *self, stop);
  progress.state = JobState::kWaiting;
  write_job_progress(job_dir, progress);
  if (stop()) throw Error(ErrorCode::kInterrupted, "cancelled");
  return true;
}

}  // namespace

void add_run_command(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("run", "Lease GPUs, then run a command with them visible");
  auto options = std::make_shared<RequestOptions>();
  auto argv = std::make_shared<std::vector<std::string>>();
  auto on_loss = std::make_shared<std::string>("warn");
  options->add_to(*command);
  command
      ->add_option("--on-lease-loss", *on_loss,
                   "Redis backend: what to do if the lease is lost (not renewable for its TTL): "
                   "warn, or kill the command (SIGTERM, then SIGKILL after 10 s)")
      ->check(CLI::IsMember({"warn", "kill"}))
      ->capture_default_str();
  auto on_over_memory = std::make_shared<std::string>();
  command
      ->add_option("--on-over-memory", *on_over_memory,
                   "Shared leases (--mem): when the command's processes use more GPU memory than "
                   "reserved: warn, or term (SIGTERM, then SIGKILL after 10 s); default: neither")
      ->check(CLI::IsMember({"warn", "term"}));
  auto time_limit = std::make_shared<std::string>();
  command
      ->add_option("--time", *time_limit,
                   "Stop the command once it has run this long (SIGTERM, then SIGKILL 10 s "
                   "later), e.g. 30m, 12h")
      ->check(duration_check());
  // The supervisor of a job (gpulock submit): its directory, and the descriptor of its lock.
  auto job_dir = std::make_shared<std::string>();
  auto job_lock_fd = std::make_shared<int>(-1);
  command->add_option("--job", *job_dir)->group("");
  command->add_option("--job-lock-fd", *job_lock_fd)->group("");
  command->add_option("command", *argv, "The command and its arguments (after --)")->required();
  command->footer(
      "The command gets CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER=PCI_BUS_ID, GPULOCK_LEASE_ID and\n"
      "GPULOCK_GPUS (on Redis also GPULOCK_FENCING_TOKEN and GPULOCK_LEASE_HOST). With lock files "
      "the\n"
      "lease lasts while any process of the command holds it, even if gpulock itself is killed;\n"
      "on Redis gpulock renews it while the command runs. gpulock exits with the command's\n"
      "status (128+N if signal N killed it).");
  command->callback([options, argv, on_loss, on_over_memory, time_limit, job_dir, job_lock_fd,
                     exit_status] {
    if (!on_over_memory->empty() && options->mem.empty() && options->slots == 0)
      throw Error(ErrorCode::kInvalidArgument,
                  "--on-over-memory watches a shared lease: use it with --mem or --slots");
    const bool job = !job_dir->empty();
    JobProgress progress;
    progress.supervisor_pid = ::getpid();
    if (job) {
      // The job's lock stays with this process alone: a command left running after this
      // process died must not keep the job from showing as lost.
      if (*job_lock_fd < 0 || ::fcntl(*job_lock_fd, F_SETFD, FD_CLOEXEC) != 0)
        throw Error(ErrorCode::kInvalidArgument, "--job needs the job's lock (--job-lock-fd)");
      // `gpulock cancel` sends SIGTERM: while waiting it ends the wait, as a cancel.
      if (::pipe2(stop_pipe, O_NONBLOCK | O_CLOEXEC) != 0) stop_pipe[0] = stop_pipe[1] = -1;
      struct sigaction on_term {};
      on_term.sa_handler = ask_to_stop;
      ::sigaction(SIGTERM, &on_term, nullptr);
      // The lease says whose it is: `job ID` and the job's name or label, in status, queue,
      // the dashboard, metrics and the usage journal (`usage --by job` reads it back).
      const std::string id = std::filesystem::path(*job_dir).filename().string();
      options->label = job_lease_label(id, options->label);
    }
    const auto limit = time_limit->empty()
                           ? std::optional<std::chrono::milliseconds>()
                           : std::optional<std::chrono::milliseconds>(parse_duration(*time_limit));
    std::optional<GpuPool> pool_holder;  // outlives the lease
    std::optional<Lease> lease;
    try {
      if (job && !wait_for_dependencies(*job_dir, progress, exit_status)) return;
      GpuPool& pool = pool_holder.emplace(open_pool(options->backend));
      lease = acquire_for_cli(pool, *options, fmt::format("{}", fmt::join(*argv, " ")), {},
                              job ? std::function<bool()>([dir = *job_dir] {
                                return stop_asked.load() || job_cancel_requested(dir);
                              })
                                  : std::function<bool()>(),
                              stop_pipe[0]);
      std::function<bool()> over_memory;
      if (!on_over_memory->empty())
        over_memory = over_memory_check(
            pool, *lease,
            *on_over_memory == "term" ? OverMemoryAction::kTerm : OverMemoryAction::kWarn);
      if (job) {
        if (job_cancel_requested(*job_dir)) throw Error(ErrorCode::kInterrupted, "cancelled");
        progress.state = JobState::kRunning;
        progress.started_unix = unix_now();
        progress.lease_id = lease->id();
        for (const auto& gpu : lease->gpus()) progress.gpus.push_back(gpu.display_index);
        write_job_progress(*job_dir, progress);
      }
      // Checked every second with a limit or a job (a cancel), else every 2 s for memory.
      const auto started = std::chrono::steady_clock::now();
      std::optional<CommandEnd> stopped_for;  // why `check` stopped the command
      std::function<bool()> check;
      if (limit || job || over_memory)
        check = [&, over_memory] {
          if (job && job_cancel_requested(*job_dir)) {
            stopped_for = CommandEnd::kCancelled;
            return true;
          }
          if (limit && std::chrono::steady_clock::now() - started >= *limit) {
            if (!stopped_for)
              print_error(
                  fmt::format("the command ran past its --time {}; stopping it", *time_limit));
            stopped_for = CommandEnd::kTimeout;
            return true;
          }
          if (over_memory && over_memory()) {
            stopped_for = CommandEnd::kOverMemory;
            return true;
          }
          return false;
        };
      if (job) start_job_log_relay(load_config().job_log_size);
      *exit_status =
          run_command(*lease, *argv, options->visible_format(),
                      *on_loss == "kill" ? LeaseLossAction::kKill : LeaseLossAction::kWarn, check,
                      limit || job ? std::chrono::seconds(1) : std::chrono::seconds(2), job);
      // A cancel may also come as the SIGTERM that `gpulock cancel` sends, passed on.
      if (!stopped_for && *exit_status != 0 && job && job_cancel_requested(*job_dir))
        stopped_for = CommandEnd::kCancelled;
      if (stopped_for)
        if (std::optional<CommandOutcome> outcome = lease->outcome()) {
          outcome->how = *stopped_for;
          lease->set_outcome(*outcome);
        }
      const bool timed_out = stopped_for == CommandEnd::kTimeout;
      if (job) record_end(*job_dir, progress, *exit_status, timed_out);
    } catch (const Error& e) {
      if (!job) throw;
      // The job ends here, cancelled or failed, with the reason.
      progress.ended_unix = unix_now();
      const bool cancelled = job_cancel_requested(*job_dir);
      progress.state = cancelled ? JobState::kCancelled : JobState::kFailed;
      progress.reason = cancelled ? (lease ? "cancelled" : "cancelled while waiting") : e.what();
      write_job_progress(*job_dir, progress);
      if (cancelled) {
        *exit_status = 143;
        return;
      }
      throw;
    } catch (const std::exception& e) {
      // Anything else (a malformed record, no memory): the job fails with it, never shows lost.
      if (!job) throw;
      progress.ended_unix = unix_now();
      progress.state = JobState::kFailed;
      progress.reason = e.what();
      write_job_progress(*job_dir, progress);
      throw;
    }
  });
}

}  // namespace gpulock::cli
