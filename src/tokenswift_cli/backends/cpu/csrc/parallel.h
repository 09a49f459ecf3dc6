// Work shared by chunks, not by threads: `parallel::split(begin, end, grain, body)` cuts the range into
// one chunk per thread, which the calling thread and the pool's helpers claim, and returns when every
// chunk is done, whether or not a helper ever woke up.
//
// Why not OpenMP's (ATen's) parallel_for: its fork/join waits at every split for each thread of the
// team to arrive. A plain step of the embedded model makes ~250 splits of 10-50 us each, so when
// another process holds one of two cores, each split waits for a thread the scheduler runs late (a
// time slice, milliseconds): two threads then wrote ~1 token/s against ~80 with one (issue 41). Here
// a late helper costs nothing: the caller claims the chunks it has not taken. Only a chunk a helper
// claimed and was then preempted in makes the caller wait.
//
// The chunks a body gets depend on the thread count and on who claims what, so callers give the same
// bits for any cut of the range (every kernel here computes each output on its own).
#pragma once

#include <cstdint>

namespace parallel {

using Body = void (*)(const void* context, int64_t begin, int64_t end);

// Runs body(context, b, e) over [begin, end) cut into chunks of at least `grain`, on
// at::get_num_threads() threads (the caller and helpers). Nested calls, and calls while another thread
// uses the pool, run on the calling thread alone.
void split_range(int64_t begin, int64_t end, int64_t grain, Body body, const void* context);

template <typename F>
void split(int64_t begin, int64_t end, int64_t grain, const F& body) {
  split_range(
      begin, end, grain,
      [](const void* context, int64_t b, int64_t e) { (*static_cast<const F*>(context))(b, e); }, &body);
}

}  // namespace parallel
