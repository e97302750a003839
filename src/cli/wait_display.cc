// The "waiting for GPUs" display: a live line on a terminal, log lines elsewhere.
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
  std::string blocking;  // the current reasons, one line
  bool shown = false;
};

std::string summarize(const WaitProgress& progress) {
  std::string text;
  for (const auto& b : progress.blocking) {
    if (!text.empty()) text += "; ";
    text += b.reason.starts_with("GPU ") ? b.reason : "GPU " + b.display_index + " " + b.reason;
  }
  return text;
}

void redraw(DisplayState& state) {
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::steady_clock::now() - state.started);
  std::string line = fmt::format("gpulock: waiting {} for {}: {}", format_duration(waited),
                                 state.what, state.blocking);
  if (line.size() > 160) line = line.substr(0, 157) + "...";
  fmt::print(stderr, "\r\033[K{}", line);
  std::fflush(stderr);
  state.shown = true;
}

}  // namespace

WaitHooks make_wait_display(const std::string& what) {
  auto state = std::make_shared<DisplayState>();
  state->what = what;
  state->terminal = ::isatty(STDERR_FILENO) != 0;
  WaitHooks hooks;
  hooks.on_progress = [state](const WaitProgress& progress) {
    state->blocking = summarize(progress);
    if (state->terminal) {
      redraw(*state);
    } else {
      fmt::print(stderr, "gpulock: waiting for {}: {}\n", state->what, state->blocking);
    }
  };
  if (state->terminal) {
    // Polled while waiting: refresh the elapsed time about once a second.
    hooks.interrupt_poll = std::chrono::milliseconds(1000);
    hooks.interrupted = [state] {
      if (state->shown) redraw(*state);
      return false;
    };
  }
  return hooks;
}

}  // namespace gpulock::cli
