// What `gpulock serve` hides from the network unless the config's serve_show_commands allows:
// command lines (which may carry tokens, paths, data set names) are cut to the program's name.
#pragma once

#include <string>

#include "gpulock/queue.hpp"
#include "gpulock/status.hpp"

namespace gpulock::serve {

// "python3" for "/usr/bin/python3 train.py --token=…"; "" for "".
std::string program_name(const std::string& command_line);

void redact_commands(PoolStatus& status);
void redact_commands(QueueStatus& queue);

}  // namespace gpulock::serve
