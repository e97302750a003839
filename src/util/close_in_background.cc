// close_in_background: a detached thread per descriptor, which only closes it.
#include "util/close_in_background.h"

#include <system_error>
#include <thread>

#include "util/signals_blocked.h"

namespace gpulock {

void close_in_background(UniqueFd fd) {
  if (!fd) return;
  const int raw = fd.release();
  try {
    // The thread inherits the mask: it must not take the signals the program reads itself.
    const SignalsBlocked blocked;
    std::thread([raw] { UniqueFd closing(raw); }).detach();
  } catch (const std::system_error&) {
    UniqueFd closing(raw);  // out of threads: close it here, late rather than never
  }
}

}  // namespace gpulock
