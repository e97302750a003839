// The gpulock command line: one function per subcommand, over the public library only.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "gpulock/gpulock.hpp"

namespace gpulock::cli {

// Options shared by the commands that lease GPUs (selection and waiting).
struct RequestOptions {
  unsigned count = 1;
  std::string gpus;
  std::string min_free_mem;
  std::string max_util;
  std::string max_power;
  bool allow_foreign = false;
  std::string timeout;
  bool no_wait = false;
  std::string label;
  std::string priority = "normal";
  std::string visible = "index";
  bool verbose = false;
  bool quiet = false;  // no "waiting for GPUs" line
  std::string backend;
  std::string hosts;
  std::string mem;  // a shared lease: this much memory of each GPU
  unsigned slots = 0;
  bool spread = false;

  void add_to(CLI::App& command);
  // Builds the library request, reading CUDA_VISIBLE_DEVICES from the environment.
  LeaseRequest to_request() const;
  VisibleFormat visible_format() const;
};

// A validator for a duration option (90s, 5m, 2h): a malformed one is a usage error (exit 64).
CLI::Validator duration_check();

// --backend URL on a command: the backend it uses (over GPULOCK_BACKEND and the config).
void add_backend_option(CLI::App& command, std::string& backend);
// The pool the options name: GpuPool::open() with the --backend value when given.
GpuPool open_pool(const std::string& backend);

// Each registers its subcommand; the callback stores the exit status in *exit_status.
void add_run_command(CLI::App& app, int* exit_status);
void add_acquire_command(CLI::App& app, int* exit_status);
void add_release_command(CLI::App& app, int* exit_status);
void add_status_command(CLI::App& app, int* exit_status);
void add_queue_command(CLI::App& app, int* exit_status);
void add_gpus_command(CLI::App& app, int* exit_status);
void add_init_command(CLI::App& app, int* exit_status);
void add_doctor_command(CLI::App& app, int* exit_status);
void add_metrics_command(CLI::App& app, int* exit_status);
void add_serve_command(CLI::App& app, int* exit_status);
void add_usage_command(CLI::App& app, int* exit_status);    // cmd_usage.cc
void add_log_command(CLI::App& app, int* exit_status);      // cmd_usage.cc
void add_journal_command(CLI::App& app, int* exit_status);  // `journal seal`
// submit, jobs, logs, wait, cancel (cmd_jobs.cc).
void add_job_commands(CLI::App& app, int* exit_status);
// The job store the commands use: JobStore::open(default_jobs_directory()) (cmd_jobs.cc).
JobStore open_job_store();
// Prints what sealing the journal did: files on stdout, problems as warnings on stderr. True
// when every file is sealed (cmd_journal.cc).
bool print_seal_report(const JournalSealReport& report);
// The hidden `__complete` command of the shell completion scripts (cmd_complete.cc).
void add_complete_command(CLI::App& app, int* exit_status);

// The subcommands shown in --help (not the hidden `__complete`).
std::vector<CLI::App*> visible_commands(CLI::App& app);
// The candidate closest to `word` if it is close enough to be a typo of it, else "".
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);
// For a command line the parser rejected: names the first unknown command or option in `args`
// (argv without the program name) and suggests the closest valid one; "" if all are known.
std::string explain_usage_error(CLI::App& app, const std::vector<std::string>& args);

// Shows a waiting request's progress on stderr: a live line on a terminal, else a log line
// whenever what it waits for changes. Returns hooks for GpuPool::acquire.
// A live line where stderr is this process's controlling terminal and it runs in the
// foreground; one line where stderr is not a terminal; nothing for a background job on a
// terminal (150 of them must not write 150 lines over the foreground one), nor with `quiet`.
WaitHooks make_wait_display(const std::string& what, bool quiet = false);

// Leases GPUs as the options ask, with the wait display and the simulated-GPU note;
// `also_on_progress`, when set, sees the wait's progress after the display; `interrupted`, when
// set, ends the wait (Error kInterrupted) once it returns true.
Lease acquire_for_cli(GpuPool& pool, const RequestOptions& options, const std::string& command,
                      const std::function<void(const WaitProgress&)>& also_on_progress = {},
                      const std::function<bool()>& interrupted = {}, int interrupt_fd = -1);

// `gpulock serve`, its options parsed: in gpulock, runs the gpulock-serve program with the
// same arguments (serve_exec.cc); in gpulock-serve, runs the server (serve_run.cc).
void run_serve(const std::string& listen, const std::string& backend, int* exit_status);

// The command line as main() received it (argv), for gpulock serve to pass on.
inline std::vector<std::string> command_line;

// Set by main() when gpulock started with its standard output closed.
inline bool stdout_was_closed = false;

// Set by a command whose output a shell runs (`eval "$(gpulock acquire …)"`): what to print on
// standard output when the command fails with this exit status, so that the shell stops too.
inline std::function<std::string(int status)> output_on_failure;

// "gpulock: " + message on stderr.
void print_error(const std::string& message);
// Ends the process by `signal` with its default action, as a shell expects of a command the
// signal stopped (SIGINT: $? is 130; SIGPIPE: 141, and no message).
[[noreturn]] void die_by_signal(int signal);

// Tables on a terminal (terminal_width.cc): the display width of UTF-8 text (one column per
// character); the terminal's width, 0 when stdout is not one (nothing is cut then); a line cut
// to `columns` with an ellipsis (whole where `columns` is 0).
std::size_t width_of(const std::string& text);
std::size_t terminal_columns();
std::string fit(const std::string& line, std::size_t columns);

// Seconds since the Unix epoch, now (the jobs' records keep times so).
inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace gpulock::cli
