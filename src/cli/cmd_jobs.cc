// Jobs on the command line: `gpulock submit`, `jobs`, `logs`, `wait`, `cancel` and `resubmit`.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

// The options given on `command` (but those named in `skip`) as `gpulock run` takes them again.
std::vector<std::string> given_options(const CLI::App& command,
                                       const std::vector<std::string>& skip) {
  std::vector<std::string> args;
  for (const CLI::Option* option : command.get_options()) {
    if (option->count() == 0 || option->get_lnames().empty()) continue;
    const std::string name = "--" + option->get_lnames().front();
    if (std::find(skip.begin(), skip.end(), name) != skip.end()) continue;
    if (option->get_type_size() == 0) {
      for (std::size_t i = 0; i < option->count(); ++i) args.push_back(name);
    } else {
      for (const std::string& value : option->results()) args.push_back(name + "=" + value);
    }
  }
  return args;
}

std::uint64_t job_id_argument(const std::string& text) {
  std::uint64_t id = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), id);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || id == 0)
    throw Error(ErrorCode::kInvalidArgument, fmt::format("'{}' is not a job id", text));
  return id;
}

// --begin: a duration from now (30m, 2h), a time of day (22:30, the next one), or a local date
// and time (2026-12-24T18:00, seconds optional). Unix seconds.
std::int64_t parse_begin(const std::string& text) {
  try {
    return unix_now() +
           std::chrono::duration_cast<std::chrono::seconds>(parse_duration(text)).count();
  } catch (const Error&) {
  }
  const std::time_t now = std::time(nullptr);
  std::tm today{};
  ::localtime_r(&now, &today);
  today.tm_sec = 0;
  for (const char* format : {"%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%H:%M:%S", "%H:%M"}) {
    std::tm parsed = today;
    const char* end = ::strptime(text.c_str(), format, &parsed);
    if (end != nullptr && *end == '\0') {
      parsed.tm_isdst = -1;
      std::time_t t = std::mktime(&parsed);
      if (format[1] == 'H' && t <= now) t += 24 * 3600;  // a time of day past today: tomorrow's
      return t;
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("--begin '{}': give a duration (30m), a time (22:30) or a date and time "
                          "(2026-12-24T18:00)",
                          text));
}

// --array: indices (1-150, 1,4,9-12) and, after %, how many may run at once (0: no limit).
std::pair<std::vector<std::int64_t>, unsigned> parse_array(const std::string& text) {
  const auto bad = [&text](const std::string& why) {
    return Error(ErrorCode::kInvalidArgument,
                 fmt::format("--array '{}': {} (e.g. 1-150, 1,4,9-12, 0-99%8)", text, why));
  };
  const auto number = [&bad](std::string_view digits) {
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value < 0)
      throw bad("'" + std::string(digits) + "' is not an index");
    return value;
  };
  std::string_view ranges = text;
  unsigned limit = 0;
  if (const auto percent = ranges.find('%'); percent != std::string_view::npos) {
    const std::int64_t k = number(ranges.substr(percent + 1));
    if (k < 1 || k > 1024) throw bad("the limit after % must be 1 to 1024");
    limit = static_cast<unsigned>(k);
    ranges = ranges.substr(0, percent);
  }
  std::vector<std::int64_t> indices;
  while (!ranges.empty()) {
    const auto comma = ranges.find(',');
    const std::string_view part = ranges.substr(0, comma);
    ranges = comma == std::string_view::npos ? std::string_view() : ranges.substr(comma + 1);
    const auto dash = part.find('-');
    const std::int64_t low = number(part.substr(0, dash));
    const std::int64_t high = dash == std::string_view::npos ? low : number(part.substr(dash + 1));
    if (high < low) throw bad("a range must go up");
    if (high - low >= 100000 || indices.size() + static_cast<std::size_t>(high - low) >= 100000)
      throw bad("at most 100,000 jobs in one array");
    for (std::int64_t i = low; i <= high; ++i) indices.push_back(i);
  }
  if (indices.empty()) throw bad("no index");
  return {indices, limit};
}

// `{}` in an array job's arguments: its index.
std::string with_index(const std::string& text, std::int64_t index) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "{}") == 0) {
      out += std::to_string(index);
      ++i;
    } else {
      out += text[i];
    }
  }
  return out;
}

// --after ID,…: each an existing job.
std::vector<std::uint64_t> job_ids_of(const JobStore& store,
                                      const std::vector<std::string>& texts) {
  std::vector<std::uint64_t> ids;
  for (const auto& text : texts) {
    const std::uint64_t id = job_id_argument(text);
    if (!store.find(id))
      throw Error(ErrorCode::kNotFound, fmt::format("no job {} to run after", id));
    ids.push_back(id);
  }
  return ids;
}

JobInfo existing_job(const JobStore& store, std::uint64_t id) {
  auto job = store.find(id);
  if (!job)
    throw Error(ErrorCode::kNotFound, fmt::format("no job {} in {}", id, store.root().string()));
  return *job;
}

std::string when_text(std::int64_t unix) {
  if (unix == 0) return "-";
  const std::time_t t = unix;
  std::tm local{};
  ::localtime_r(&t, &local);
  char text[32];
  std::strftime(text, sizeof text, "%m-%d %H:%M:%S", &local);
  return text;
}

std::string elapsed_text(const JobInfo& job) {
  const auto& p = job.progress;
  if (p.started_unix == 0) return "-";
  const std::int64_t end = p.ended_unix ? p.ended_unix : unix_now();
  return format_duration(std::chrono::seconds(std::max<std::int64_t>(0, end - p.started_unix)));
}

void print_jobs(const std::vector<JobInfo>& jobs) {
  fmt::print("{:>6}  {:<12} {:<17} {:<16} {:<6} {:<14} {:>8} {:>5}  {}\n", "ID", "USER", "STATE",
             "NAME", "GPUS", "SUBMITTED", "ELAPSED", "EXIT", "COMMAND");
  for (const JobInfo& job : jobs) {
    if (!job.problem.empty()) {
      fmt::print("{:>6}  {:<12} {:<17} {}\n", job.id, job.owner_name, "?", job.problem);
      continue;
    }
    const auto& p = job.progress;
    fmt::print("{:>6}  {:<12} {:<17} {:<16} {:<6} {:<14} {:>8} {:>5}  {}\n", job.id, job.owner_name,
               job_state_name(p.state), job.spec.name.empty() ? "-" : job.spec.name,
               p.gpus.empty() ? "-" : fmt::format("{}", fmt::join(p.gpus, ",")),
               when_text(job.spec.submitted_unix), elapsed_text(job),
               p.exit_status ? std::to_string(*p.exit_status) : "-",
               fmt::format("{}", fmt::join(job.spec.command, " ")));
  }
}

// The exit status `gpulock wait` gives for a job that ended: 0 if done, else its command's (128+N
// for a signal); for a job whose command never ran, 143 if cancelled and 69 otherwise (lost,
// unreadable, or refused by the queue).
int job_exit_status(const JobInfo& job) {
  if (!job.problem.empty() || job.progress.state == JobState::kLost) return 69;
  if (job.progress.state == JobState::kDone) return 0;
  if (const auto status = job.progress.exit_status; status && *status != 0) return *status;
  // Stopped (a cancel, a time limit) but exited 0 anyway, or stopped before it ran.
  const JobState state = job.progress.state;
  return state == JobState::kCancelled || state == JobState::kTimeout ? 143 : 69;
}

// Copies what `fd` holds from `offset` to stdout; returns the new offset.
off_t copy_from(int fd, off_t offset) {
  char buffer[65536];
  while (true) {
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return offset;
    std::fwrite(buffer, 1, static_cast<std::size_t>(n), stdout);
    offset += n;
  }
}

// Starts the supervisor of a job just made from `spec`: the hidden `gpulock run --job`.
void start_supervisor(JobStore::Created& job, const JobSpec& spec) {
  std::vector<std::string> args = {"gpulock",       "run", "--job", job.directory.string(),
                                   "--job-lock-fd", "3"};
  const bool labelled =
      std::any_of(spec.lease_options.begin(), spec.lease_options.end(),
                  [](const std::string& option) { return option.starts_with("--label="); });
  if (!spec.name.empty() && !labelled) args.push_back("--label=" + spec.name);
  args.insert(args.end(), spec.lease_options.begin(), spec.lease_options.end());
  args.push_back("--");
  args.insert(args.end(), spec.command.begin(), spec.command.end());
  launch_job(job, "/proc/self/exe", args);
}

void add_submit(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "submit", "Queue a command as a job: it waits for GPUs and runs detached, with logs");
  auto options = std::make_shared<RequestOptions>();
  auto name = std::make_shared<std::string>();
  auto argv = std::make_shared<std::vector<std::string>>();
  auto time_limit = std::make_shared<std::string>();
  auto readable = std::make_shared<bool>(false);
  auto private_logs = std::make_shared<bool>(false);
  options->add_to(*command);
  command->add_option("--name", *name, "A name for the job (shown by `gpulock jobs`)");
  command
      ->add_option("--time", *time_limit,
                   "Stop the job once it has run this long (SIGTERM, then SIGKILL 10 s later)")
      ->check(duration_check());
  auto* readable_flag = command->add_flag(
      "--readable-logs", *readable,
      "Let every user read the job's output (default: only you and root, unless the config's "
      "job_logs_readable says every user)");
  command->add_flag("--private-logs", *private_logs, "Only you and root read the job's output")
      ->excludes(readable_flag);
  auto after = std::make_shared<std::vector<std::string>>();
  auto after_any = std::make_shared<std::vector<std::string>>();
  auto begin = std::make_shared<std::string>();
  auto array = std::make_shared<std::string>();
  command->add_option("--array", *array,
                      "One job per index, {} in the arguments and GPULOCK_ARRAY_INDEX set to it: "
                      "1-150, 1,4,9-12; %K: at most K at once (1-150%4)");
  // One argument each (ID,ID,…): a list must not swallow the `--` before the command.
  command->add_option("--after", *after, "Run once these jobs have ended done (ID,...)")
      ->delimiter(',')
      ->allow_extra_args(false);
  command->add_option("--after-any", *after_any, "Run once these jobs have ended at all (ID,...)")
      ->delimiter(',')
      ->allow_extra_args(false);
  command->add_option("--begin", *begin,
                      "Not before this time: a duration (30m), a time (22:30) or 2026-12-24T18:00");
  command->add_option("command", *argv, "The command and its arguments (after --)")->required();
  command->footer(
      "Prints the job's id and returns at once. The job waits in the same queue as `gpulock "
      "run`,\nthen runs as `gpulock run` would, in the directory and with the environment of "
      "the\nsubmission, in a session of its own: it survives the terminal and the SSH session.\n"
      "Its output goes to files that `gpulock logs ID` shows. See docs/jobs.md.");
  command->callback([command, options, name, argv, time_limit, readable, private_logs, after,
                     after_any, begin, array, exit_status] {
    if (options->no_wait)
      throw Error(ErrorCode::kInvalidArgument, "a job waits for its GPUs: --no-wait is for run");
    const Config config = load_config();  // read once: the store, and who may read the logs
    const JobStore store = JobStore::open(default_jobs_directory(config));
    JobSpec spec;
    spec.name = *name;
    spec.lease_options = given_options(*command, {"--name", "--readable-logs", "--private-logs",
                                                  "--after", "--after-any", "--begin", "--array"});
    const bool logs_readable = *readable || (!*private_logs && config.job_logs_readable);
    spec.after = job_ids_of(store, *after);
    spec.after_any = job_ids_of(store, *after_any);
    if (!begin->empty()) spec.begin_unix = parse_begin(*begin);
    spec.command = *argv;
    std::error_code error;
    spec.working_directory = std::filesystem::current_path(error).string();
    if (error)
      throw Error(ErrorCode::kEnvironment, "cannot tell the current directory: " + error.message());
    spec.submitted_unix = unix_now();
    // Submitted from inside a lease (`gpulock run -- ./sweep.sh`): the job is not part of it, and
    // must not be held to its GPUs by the CUDA_VISIBLE_DEVICES the lease set.
    if (std::getenv("GPULOCK_LEASE_ID") != nullptr)
      for (const char* name : {"GPULOCK_LEASE_ID", "GPULOCK_GPUS", "CUDA_VISIBLE_DEVICES",
                               "GPULOCK_FENCING_TOKEN", "GPULOCK_LEASE_HOST"})
        ::unsetenv(name);
    // One job, or one per index of the array: each printed once it is on its way.
    const auto [indices, limit] = array->empty()
                                      ? std::pair<std::vector<std::int64_t>, unsigned>{{}, 0}
                                      : parse_array(*array);
    const std::size_t count = array->empty() ? 1 : indices.size();
    for (std::size_t position = 0; position < count; ++position) {
      JobSpec one = spec;
      if (!array->empty()) {
        const std::int64_t index = indices[position];
        for (auto& arg : one.command) arg = with_index(arg, index);
        if (!one.name.empty()) one.name = fmt::format("{}[{}]", spec.name, index);
        one.array_index = index;
        one.array_position = position;
        one.array_limit = limit;
        if (position > 0) one.array_first = spec.array_first;
      }
      JobStore::Created job = store.create(one, logs_readable);
      if (!array->empty() && position == 0) {
        spec.array_first = job.id;
        if (limit != 0) store.create_array_slots(job.id, limit);
      }
      start_supervisor(job, one);
      fmt::print("{}\n", job.id);
      std::fflush(stdout);
    }
    *exit_status = 0;
  });
}

void add_resubmit(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "resubmit", "Submit ended jobs of yours again, as they were submitted: prints the new ids");
  auto ids = std::make_shared<std::vector<std::string>>();
  command->add_option("ids", *ids, "Job ids")->required();
  command->footer(
      "The new job runs the same command with the same options, in the same directory, and\n"
      "with this shell's environment. Jobs it waited for have ended: it does not wait again.\n"
      "A job of an array comes back alone, with its index, outside the array's %K limit.");
  command->callback([ids, exit_status] {
    const JobStore store = open_job_store();
    std::vector<JobInfo> jobs;
    for (const auto& text : *ids) {  // all checked before any is submitted
      JobInfo job = existing_job(store, job_id_argument(text));
      if (!job.problem.empty())
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("job {} cannot be read: {}", job.id, job.problem));
      if (job.owner != ::geteuid())
        throw Error(ErrorCode::kPermissionDenied,
                    fmt::format("job {} is {}'s: only its owner can submit it again (it would "
                                "run as you)",
                                job.id, job.owner_name));
      if (!job_state_is_final(job.progress.state))
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("job {} is {}: only an ended job is submitted again (`gpulock "
                                "cancel {}` first)",
                                job.id, job_state_name(job.progress.state), job.id));
      jobs.push_back(std::move(job));
    }
    const auto here = std::filesystem::current_path();
    for (const JobInfo& old : jobs) {
      JobSpec spec = old.spec;
      spec.submitted_unix = unix_now();
      spec.after.clear();
      spec.after_any.clear();
      spec.begin_unix = 0;
      spec.array_first = 0;
      spec.array_position = 0;
      spec.array_limit = 0;
      spec.resubmitted_from = old.id;
      // The supervisor starts where the job was submitted, as the first time.
      std::error_code error;
      std::filesystem::current_path(spec.working_directory, error);
      if (error)
        throw Error(ErrorCode::kEnvironment,
                    fmt::format("job {}: cannot enter its directory {}: {}", old.id,
                                spec.working_directory, error.message()));
      struct stat log {};
      const bool readable =
          ::stat((old.directory / "stdout").c_str(), &log) == 0 && (log.st_mode & S_IROTH) != 0;
      JobStore::Created job = store.create(spec, readable);
      start_supervisor(job, spec);
      std::filesystem::current_path(here);
      fmt::print("{}\n", job.id);
      std::fflush(stdout);
    }
    *exit_status = 0;
  });
}

void add_jobs(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("jobs", "List jobs: yours, or every user's with --all");
  auto all = std::make_shared<bool>(false);
  auto states = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto clean = std::make_shared<bool>(false);
  command->add_flag("-a,--all", *all, "Every user's jobs (read-only)");
  command
      ->add_option("--state", *states,
                   "Only jobs in these states: held, waiting, running, done, failed, "
                   "cancelled, timeout, lost, dependency-failed")
      ->delimiter(',')
      ->check(CLI::IsMember({"held", "waiting", "running", "done", "failed", "cancelled", "timeout",
                             "lost", "dependency-failed"}));
  command->add_flag("--json", *json, "Machine-readable output (docs/jobs.md)");
  command->add_flag("--clean", *clean, "Forget your jobs that have ended (their records and logs)");
  command->callback([all, states, json, clean, exit_status] {
    const JobStore store = open_job_store();
    if (*clean) {
      const std::size_t removed = store.clean();
      fmt::print("removed {} ended job{}\n", removed, removed == 1 ? "" : "s");
      *exit_status = 0;
      return;
    }
    std::vector<JobInfo> shown;
    for (JobInfo& job : store.list()) {
      if (!*all && job.owner != ::geteuid()) continue;
      if (!states->empty() &&
          (!job.problem.empty() || std::find(states->begin(), states->end(),
                                             job_state_name(job.progress.state)) == states->end()))
        continue;
      shown.push_back(std::move(job));
    }
    if (*json) {
      fmt::print("{}\n", jobs_to_json(shown));
    } else {
      print_jobs(shown);
    }
    *exit_status = 0;
  });
}

void add_logs(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("logs", "Show a job's output (stdout; --stderr)");
  auto id = std::make_shared<std::string>();
  auto err = std::make_shared<bool>(false);
  auto follow = std::make_shared<bool>(false);
  command->add_option("id", *id, "The job's id")->required();
  command->add_flag("--stderr", *err, "Its standard error instead");
  command->add_flag("-f,--follow", *follow, "Keep printing what it writes until the job ends");
  command->callback([id, err, follow, exit_status] {
    const JobStore store = open_job_store();
    const JobInfo job = existing_job(store, job_id_argument(*id));
    const auto path = job.directory / (*err ? "stderr" : "stdout");
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
      throw Error(
          errno == EACCES ? ErrorCode::kPermissionDenied : ErrorCode::kEnvironment,
          fmt::format("cannot read job {}'s {}: {}", job.id, path.string(), std::strerror(errno)));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{fd};
    off_t offset = copy_from(fd, 0);
    while (*follow) {
      std::fflush(stdout);
      const auto now = store.find(job.id);
      const bool ended = !now || !now->problem.empty() || job_state_is_final(now->progress.state);
      offset = copy_from(fd, offset);
      if (ended) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    *exit_status = 0;
  });
}

void add_wait(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand(
      "wait", "Wait for jobs to end; exit with the first failure's status (0 if all done)");
  auto ids = std::make_shared<std::vector<std::string>>();
  command->add_option("ids", *ids, "Job ids")->required();
  command->callback([ids, exit_status] {
    const JobStore store = open_job_store();
    std::vector<std::uint64_t> wanted;
    for (const auto& text : *ids) wanted.push_back(job_id_argument(text));
    int status = 0;
    for (const std::uint64_t id : wanted) {
      const JobInfo job = store.wait(id);
      const int code = job_exit_status(job);
      if (code != 0)
        print_error(fmt::format("job {} {}: {}", id,
                                job.problem.empty() ? job_state_name(job.progress.state) : "?",
                                job.problem.empty() ? job.progress.reason : job.problem));
      if (status == 0) status = code;
    }
    *exit_status = status;
  });
}

void add_cancel(CLI::App& app, int* exit_status) {
  auto* command = app.add_subcommand("cancel",
                                     "Cancel jobs: waiting ones leave the queue, running ones "
                                     "get SIGTERM (SIGKILL 10 s later); or end a lease of "
                                     "`gpulock run` by its id");
  auto ids = std::make_shared<std::vector<std::string>>();
  auto all = std::make_shared<bool>(false);
  command->add_option("ids", *ids, "Job ids, or lease ids (16 hex digits) of `gpulock run`");
  command->add_flag("--all", *all, "All of your jobs that have not ended");
  command->footer(
      "A lease id ends a lease of `gpulock run` (or `gpulock acquire`) on this machine, yours\n"
      "or, for root, anyone's: run passes SIGTERM on to its command and exits with it.");
  command->callback([ids, all, exit_status] {
    const JobStore store = open_job_store();
    std::vector<std::uint64_t> wanted;
    std::vector<std::string> leases;
    if (*all) {
      if (!ids->empty()) throw Error(ErrorCode::kInvalidArgument, "either job ids or --all");
      for (const JobInfo& job : store.list())
        if (job.owner == ::geteuid() && job.problem.empty() &&
            !job_state_is_final(job.progress.state))
          wanted.push_back(job.id);
    } else {
      if (ids->empty())
        throw Error(ErrorCode::kInvalidArgument, "name the jobs to cancel, or --all");
      for (const auto& text : *ids) {
        if (is_lease_id(text))
          leases.push_back(text);
        else
          wanted.push_back(job_id_argument(text));
      }
    }
    int status = 0;
    const auto failed = [&status](const Error& e) {
      print_error(e.what());
      if (status == 0) status = exit_status_for(e.code());
    };
    for (const std::uint64_t id : wanted) {
      try {
        store.cancel(id);
        fmt::print("cancelled job {}\n", id);
      } catch (const Error& e) {
        failed(e);
      }
    }
    if (!leases.empty()) {
      GpuPool pool = open_pool("");
      for (const std::string& id : leases) {
        try {
          pool.stop_lease(id);
          fmt::print("ended lease {}\n", id);
        } catch (const Error& e) {
          failed(e);
        }
      }
    }
    *exit_status = status;
  });
}

}  // namespace

JobStore open_job_store() {
  return JobStore::open(default_jobs_directory());
}

void add_job_commands(CLI::App& app, int* exit_status) {
  add_submit(app, exit_status);
  add_jobs(app, exit_status);
  add_logs(app, exit_status);
  add_wait(app, exit_status);
  add_cancel(app, exit_status);
  add_resubmit(app, exit_status);
}

}  // namespace gpulock::cli
