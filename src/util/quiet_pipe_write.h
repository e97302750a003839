// A write to a pipe or FIFO that never raises SIGPIPE.
//
// The queue wakes a waiter by writing a byte into its FIFO. A waiter that leaves at that moment
// (a timeout, Ctrl-C) can close its end between the waker's open and its write; the write then
// fails with EPIPE and the kernel sends SIGPIPE, which kills a program that has not ignored it
// (a C or C++ program using the library). The signal is blocked in this thread for the write,
// and one that the write raised is taken back before the mask is restored.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace gpulock {

// write(2) without SIGPIPE: returns what write returned (errno as it set it; EPIPE when the
// reading end is gone).
ssize_t quiet_pipe_write(int fd, const void* data, std::size_t size);

}  // namespace gpulock
