// Cutting command lines to program names for `gpulock serve` (serve/redaction.h).
#include "serve/redaction.h"

namespace gpulock::serve {

std::string program_name(const std::string& command_line) {
  // The first word, quotes removed (commands are stored shell-quoted), without its directory.
  std::string word;
  char quote = 0;
  for (char c : command_line) {
    if (quote != 0) {
      if (c == quote)
        quote = 0;
      else
        word += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == ' ' || c == '\t') {
      if (!word.empty()) break;
    } else {
      word += c;
    }
  }
  const auto slash = word.rfind('/');
  return slash == std::string::npos ? word : word.substr(slash + 1);
}

void redact_commands(PoolStatus& status) {
  for (auto& gpu : status.gpus) {
    if (gpu.holder) gpu.holder->command = program_name(gpu.holder->command);
    if (gpu.shared)
      for (auto& lease : gpu.shared->leases) lease.command = program_name(lease.command);
    if (gpu.reserved_for) gpu.reserved_for->command = program_name(gpu.reserved_for->command);
  }
}

void redact_commands(QueueStatus& queue) {
  for (auto& entry : queue.entries) entry.command = program_name(entry.command);
}

}  // namespace gpulock::serve
