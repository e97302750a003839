// The "waiting for GPUs" display: a live line on a terminal, log lines elsewhere.
#include <termios.h>
#include <unistd.h>

#include <memory>

#include <fmt/format.h>

#include "cli.h"

namespace gpulock::cli {
namespace {

struct DisplayState {
  std::string what;
  bool terminal = false;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::string place;     // "position 2 of 5"
  std::string blocking;  // what it waits for, one line
  bool shown = false;
};

std::string place_text(const WaitProgress& progress) {
  if (progress.queue_length <= 0) return "";
  return fmt::format("position {} of {}", progress.position, progress.queue_length);
}

// Whether stderr is the terminal this process is in the foreground of: a background job (`&`,
// or after Ctrl-Z and `bg`) is not, and a terminal that is not ours (stderr redirected to
// another tty) has no foreground group of ours.
bool in_foreground_of_terminal() {
  const pid_t foreground = ::tcgetpgrp(STDERR_FILENO);
  return foreground > 0 && foreground == ::getpgrp();
}

void redraw(DisplayState& state) {
  if (!in_foreground_of_terminal()) return;  // moved to the background meanwhile
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::steady_clock::now() - state.started);
  std::string line =
      fmt::format("gpulock: waiting {} for {}{}: {}", format_duration(waited), state.what,
                  state.place.empty() ? "" : ", " + state.place, state.blocking);
  if (line.size() > 160) line = line.substr(0, 157) + "...";
  fmt::print(stderr, "\r\033[K{}", line);
  std::fflush(stderr);
  state.shown = true;
}

}  // namespace

WaitHooks make_wait_display(const std::string& what, bool quiet) {
  WaitHooks hooks;
  if (quiet) return hooks;
  auto state = std::make_shared<DisplayState>();
  state->what = what;
  state->terminal = ::isatty(STDERR_FILENO) != 0;
  if (state->terminal && !in_foreground_of_terminal()) return hooks;  // a background job
  hooks.on_progress = [state](const WaitProgress& progress) {
    const std::string place = place_text(progress);
    state->place = place;
    state->blocking = progress.blocked_by;
    if (state->terminal) {
      redraw(*state);
    } else if (!state->shown) {
      // A log (a file, a pipe): one line when the wait begins, not one per change of place.
      fmt::print(stderr, "gpulock: waiting for {}{}: {}\n", state->what,
                 place.empty() ? "" : ", " + place, state->blocking);
      state->shown = true;
    }
  };
  // On a terminal, a live line: re-read the place in the queue and redraw about once a second.
  if (state->terminal) hooks.progress_refresh = std::chrono::milliseconds(1000);
  return hooks;
}

}  // namespace gpulock::cli
