// Data-parallel training over processes: the world (MPI, started by mpirun), its collectives on
// cpu tensors (MPI) and CUDA tensors (NCCL), and DataParallel, which averages a module's
// gradients across the processes during backward.
//
//   // mpirun -np 2 ./train
//   dist::init();                                   // a plain ./train is a world of one
//   auto model = nn::mlp(784, 256, 10);
//   dist::DataParallel ddp(*model);                 // rank 0's parameters everywhere
//   optim::SGD opt(model->parameters(), {.lr = 0.1});
//   data::BatchIterator batches(train, 64, true, /*seed=*/1);
//   batches.set_shard(dist::rank(), dist::world_size());
//   while (batches.next(x, t)) {
//     opt.zero_grad();
//     F::softmax_cross_entropy((*model)(x), t).backward();  // gradients averaged here
//     opt.step();
//   }
//
// Contract: after backward every rank holds the same averaged gradients, (sum over ranks) *
// (1 / world_size), summed in the order MPI's all-reduce sums; with two ranks that is g0 + g1
// (one IEEE addition, the same bits either way round) times 0.5 (exact), so two ranks stay
// equal bit for bit and equal one process that sums the two half-batch gradients.
//
// Faults: every wait has a deadline (set_timeout, ENCORE_DIST_TIMEOUT, default 300 s). A peer that
// died or stalls makes the wait throw Error("dist: rank r of n waited N s for ...") instead of
// hanging; the world is then broken (later collectives throw at once) and the process should
// end. Under mpirun, a killed rank makes Open MPI end the others at once unless the job runs
// with `mpirun --enable-recovery` (then the survivors see the Error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "encore/nn.h"
#include "runtime/ops.h"
#include "runtime/tensor.h"

namespace encore::dist {

// Joins the job from the MPI environment (idempotent); a process not started by mpirun, or a
// build without MPI, is a world of one. The job's communication ends at exit (or finalize()).
void init();
bool initialized();
// This process's rank (0 ... world_size() - 1) and the number of processes; init() first.
int rank();
int world_size();
void finalize();

// The deadline of every wait, in seconds (default 300, or ENCORE_DIST_TIMEOUT).
void set_timeout(double seconds);
double timeout();

// Whether an all-reduce in flight is given progress between kernels (eager ops and replayed
// steps), so it advances during the compute after its start, without a progress thread (default
// on; ENCORE_DIST_PROGRESS=0 turns it off). Off, it advances at later starts and at its wait.
void set_progress_enabled(bool on);
bool progress_enabled();

// Returns when every rank has called it.
void barrier();
// Reduces `t` across ranks in place (every rank gets the result): two dispatched ops,
// all_reduce_start and all_reduce_wait, so a static function records them as steps. float32,
// float64, int32 and int64, on the cpu (MPI) or a CUDA device (NCCL).
void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
// The two halves of all_reduce: start returns a handle at once (the communication then owns `t`:
// nothing may read or write it) and wait_all_reduce waits for it. Communication started before
// compute overlaps with it.
Tensor start_all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum);
void wait_all_reduce(Tensor& t, const Tensor& handle);
// Copies `t` of rank `root` into `t` of every rank (not inside a traced static function).
void broadcast(Tensor& t, int root = 0);

struct DataParallelOptions {
  // Gradients are all-reduced in buckets of about this many bytes (PyTorch DDP's default): a
  // bucket's all-reduce starts as soon as its last gradient is final and overlaps with the rest
  // of backward. A parameter larger than this is a bucket of its own.
  size_t bucket_bytes = size_t{25} << 20;
};

// Averages the gradients of a module's parameters across the processes during backward, as
// PyTorch's DistributedDataParallel. On construction it checks that every rank has the same
// parameters and buffers (count, names, shapes, dtypes; an Error names one that differs) and copies
// rank 0's parameters and buffers to the others. Parameters are put into buckets in reverse
// order (backward produces the last layer's gradients first); when a backward has accumulated
// the gradient of every parameter of a bucket, the bucket (their concatenation) starts its
// all-reduce, and when the backward ends each bucket is waited for, scaled by 1 / world_size and
// copied back into the .grad of its parameters. In a static whole training step the starts are
// steps of the schedule right where the gradients became final, and the waits come after the
// rest of the backward. The first backward learns how many gradients each parameter gets (one;
// two for a weight used twice; none for one the loss does not use), all-reduces every bucket at
// its end and leaves the unused parameters out from then on (their .grad untouched), as PyTorch
// DDP with static_graph=True: every rank must count the same in it, and every later backward as
// the first (an Error names the parameter that does not). Make it after moving the model to its
// device (it hooks the parameter tensors) and before the first call of a static function that
// trains the model: a schedule traced without it replays without the all-reduce, and one traced
// with it keeps all-reducing after it is gone. In a world of one it does nothing.
class DataParallel {
 public:
  explicit DataParallel(nn::Module& module, DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  nn::Module& module() const;
  // The buckets as the names of their parameters, in the order their all-reduces start (after
  // the first backward, without the parameters it found unused).
  std::vector<std::vector<std::string>> buckets() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace encore::dist
