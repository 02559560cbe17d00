// encore::dist's routines: the world (dist/world.h) behind the public names, and the
// collectives checked and dispatched as ops.
#include "dist/world.h"

#include "api/src/routine.h"
#include "encore/dist.h"
#include "runtime/autograd.h"

namespace encore::dist {
namespace {

void check_reducible(const char* op, const Tensor& t) {
  detail::check_defined(op, "t", t);
  ENCORE_CHECK(t.dtype() != DType::Bool, op, ": ", t.str(),
               " cannot be reduced (float32, float64, int32, int64)");
  ENCORE_CHECK(initialized(), op, ": call dist::init() first");
}

}  // namespace

Tensor start_all_reduce(Tensor& t, ReduceOp op) {
  check_reducible("dist::start_all_reduce", t);
  // all_reduce_wait writes t in place, which grad mode refuses for a tensor that requires grad:
  // refuse before the communication starts, not at its wait.
  ENCORE_CHECK(!(GradMode::enabled() && t.requires_grad()), "dist::start_all_reduce: ", t.str(),
               " requires grad and grad mode is on; reduce it under NoGradGuard");
  Tensor handle = Tensor::empty({1}, DType::Int64, t.device());
  dispatch(Op::AllReduceStart, {t}, {handle}, AttrBlob::of(CollectiveAttrs{0, op, {}, 1}));
  return handle;
}

void wait_all_reduce(Tensor& t, const Tensor& handle) {
  check_reducible("dist::wait_all_reduce", t);
  detail::check_defined("dist::wait_all_reduce", "handle", handle);
  ENCORE_CHECK(handle.dtype() == DType::Int64 && handle.numel() == 1,
               "dist::wait_all_reduce: argument 'handle' ", handle.str(),
               " is not a handle from dist::start_all_reduce");
  dispatch(Op::AllReduceWait, {t, handle}, {}, AttrBlob::of(CollectiveAttrs{}));
}

void all_reduce(Tensor& t, ReduceOp op) {
  const Tensor handle = start_all_reduce(t, op);
  wait_all_reduce(t, handle);
}

void broadcast(Tensor& t, int root) {
  detail::check_defined("dist::broadcast", "t", t);
  ENCORE_CHECK(initialized(), "dist::broadcast: call dist::init() first");
  ENCORE_CHECK(current_tracer() == nullptr, "dist::broadcast of ", t.str(),
               " inside a traced static function: a replay would not repeat it; broadcast "
               "before the static call");
  dist::broadcast(BufferView{t.raw_data(), t.shape(), t.dtype()}, t.device(), root);
  t.impl()->storage->bump_version();
}

}  // namespace encore::dist
