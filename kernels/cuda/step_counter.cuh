// Adam's step counters, counted by the update kernel itself (optim.cuh): each block of a
// parameter adds one arrival to the high bits of the parameter's int64 counter, and reads the
// count the launch began with from the low bits; the last of the parameter's blocks to arrive
// stores that count plus one. So an Adam step is one kernel, the count stays on the device (a
// captured graph counts on every replay), and every block computes with the count after the
// step, as the CPU does. A count before the step is in [0, 2^kArrivalShift), 1.7e13 steps, more
// than any training takes. One loaded into the state outside that has arrival bits set before the
// launch: a negative count has the top one (as has one of 2^63), so that the first block to arrive
// sees more arrivals than there are blocks and reports it (-1); a count between 2^kArrivalShift
// and 2^kArrivalShift times the parameter's blocks is not detected. A parameter has fewer than
// 2^(64 - kArrivalShift) blocks (blocks_for's cap is 524,280). Host-compilable
// (tests/nvrtc/step_counter_emulated_test.cc runs it on the host).
#pragma once

#include <cstdint>

namespace encore::kernels::cuda {

inline constexpr int kArrivalShift = 44;

// Called once by each of the `blocks` blocks updating the parameter whose counter this is;
// returns the parameter's step count after this step, or -1 (in the first block to arrive at
// least) when the counter held a negative count.
__device__ __forceinline__ int64_t count_step(int64_t* counter, unsigned blocks) {
  using U = unsigned long long;
  constexpr U kArrival = U{1} << kArrivalShift;
  U* t = reinterpret_cast<U*>(counter);
  const U old = atomicAdd(t, kArrival);
  const U count = old & (kArrival - 1), arrived = old >> kArrivalShift;
  if (arrived >= blocks) return -1;                     // arrival bits set before the launch
  if (arrived + 1 == blocks) atomicExch(t, count + 1);  // every block has read it
  return static_cast<int64_t>(count + 1);
}

}  // namespace encore::kernels::cuda
