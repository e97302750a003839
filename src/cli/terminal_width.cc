// Fitting tables to a terminal: display widths, the terminal's width, lines cut with an
// ellipsis (status, gpus). Piped or redirected output is never cut, as ps(1) does.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "cli.h"

namespace gpulock::cli {

std::size_t width_of(const std::string& text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

std::string fit(const std::string& line, std::size_t columns) {
  if (columns == 0 || width_of(line) <= columns) return line;
  std::string out;
  std::size_t width = 0;
  for (char c : line) {
    const bool starts_character = (c & 0xC0) != 0x80;
    if (starts_character && ++width > columns - 1) break;
    out += c;
  }
  return out + "…";
}

std::size_t terminal_columns() {
  if (::isatty(STDOUT_FILENO) == 0) return 0;
  winsize size{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* columns = std::getenv("COLUMNS"); columns != nullptr && std::atoi(columns) > 0)
    return static_cast<std::size_t>(std::atoi(columns));
  return 80;
}

}  // namespace gpulock::cli
