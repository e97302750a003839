// Fork guard: descriptors whose OFD locks a child forked without exec must not share.
//
// An OFD lock belongs to the open file description, which fork() shares with the child. That is
// what makes a lease follow its job's processes, but two of the local backend's locks must stay
// with the process that took them: a waiter's queue ticket (a child forked by Python
// multiprocessing or a C fork() would keep a killed waiter "waiting" at the head of the queue)
// and the machine-wide acquire mutex (a child forked while another thread holds it would stall
// every acquisition of the machine for as long as the child lives). pthread_atfork handlers make
// the child drop its copies at once: tickets are closed, the mutex file is opened anew under the
// same descriptor number, so that the child's own pool keeps working.
#pragma once

namespace gpulock {

// The child closes its copy of `fd` (a queue ticket or wake FIFO).
void close_in_forked_child(int fd);
// The child opens `name` in the directory `dir_fd` anew under the number `fd`.
void reopen_in_forked_child(int fd, int dir_fd, const char* name);
// Stops either, before `fd` is closed.
void forget_in_forked_child(int fd);

}  // namespace gpulock
