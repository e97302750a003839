// Finding the processes that can still rewrite a sealed journal file.
//
// The append-only flag is checked when a file is opened: a descriptor opened for writing without
// O_APPEND before root sealed the file keeps working (docs/operations.md, "Sealing the
// journal"). gpulock never opens one; root's `gpulock journal seal` looks through /proc for such
// descriptors, so that a user keeping one is seen.
#pragma once

#include <string>
#include <vector>

namespace gpulock {

// One line per descriptor of any process that refers to a journal file of the open directory
// `dir_fd` and is open for writing without O_APPEND: "usage-1000.log: pid 4711 (uid 1000) ...".
// Processes whose descriptors cannot be read (not root, gone meanwhile) are passed over.
std::vector<std::string> find_journal_rewriters(int dir_fd);

}  // namespace gpulock
