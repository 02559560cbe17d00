// Progress for communication in flight. MPI moves a non-blocking collective only inside MPI
// calls; with no progress thread (one thread per rank on a machine of few cores), an all-reduce
// started during backward would do all its work at its wait. So the communication layer (dist/)
// counts the requests this thread has in flight and installs its progress function, and the
// replay loop and dispatch() call poll() after each kernel; a long kernel may also poll between
// parts of its work (the optimizer updates). With nothing in flight a poll is one thread-local
// load. Only the thread that started a request polls it (MPI is joined for one thread at a time).
#pragma once

namespace encore::comm_progress {

using ProgressFn = void (*)();
// Installed once by the communication layer.
void set_function(ProgressFn fn);

namespace detail {
extern thread_local int t_in_flight;
void run();
}  // namespace detail

// Requests this thread started that no test has found complete yet.
inline void add_in_flight(int delta) {
  detail::t_in_flight += delta;
}

// Whether this thread has requests in flight (a kernel may then poll between parts of its work).
inline bool in_flight() {
  return detail::t_in_flight > 0;
}

// Gives the communication in flight a chance to advance.
inline void poll() {
  if (detail::t_in_flight > 0) [[unlikely]]
    detail::run();
}

}  // namespace encore::comm_progress
