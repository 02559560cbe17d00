// Adam's step counters, counted by the update kernel itself (optim.cu): each block of a
// parameter adds one arrival to the high bits of the parameter's int64 counter, and reads the
// count the launch began with from the low bits; the last of the parameter's blocks to arrive
// stores that count plus one. So an Adam step is one kernel, the count stays on the device (a
// captured graph counts on every replay), and every block computes with the count after the
// step, as the CPU does. Counts stay below 2^kArrivalShift (1.7e13 steps); a parameter has
// fewer than 2^(64 - kArrivalShift) blocks (blocks_for's cap is 524,280). Host-compilable
// (tests/nvrtc/step_counter_emulated_test.cc runs it on the host).
#pragma once

#include <cstdint>

namespace encore::kernels::cuda {

inline constexpr int kArrivalShift = 44;

// Called once by each of the `blocks` blocks updating the parameter whose counter this is;
// returns the parameter's step count after this step.
__device__ __forceinline__ int64_t count_step(int64_t* counter, unsigned blocks) {
  using U = unsigned long long;
  constexpr U kArrival = U{1} << kArrivalShift;
  U* t = reinterpret_cast<U*>(counter);
  const U old = atomicAdd(t, kArrival);
  const U count = old & (kArrival - 1);
  if ((old >> kArrivalShift) + 1 == blocks) atomicExch(t, count + 1);  // every block has read it
  return static_cast<int64_t>(count + 1);
}

}  // namespace encore::kernels::cuda
