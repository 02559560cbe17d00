#include "encore/clip_grad.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "encore/functions.h"
#include "runtime/autograd.h"
#include "runtime/error.h"
#include "runtime/fused.h"

namespace encore::nn {

namespace {

// The parameters' gradients, checked to share one device and dtype.
std::vector<Tensor> grads_of(const char* op, const std::vector<Tensor>& parameters) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < parameters.size(); ++i) {
    ENCORE_CHECK(parameters[i].defined(), op, ": parameter ", i, " is undefined");
    Tensor g = parameters[i].grad();
    if (!g.defined()) continue;
    ENCORE_CHECK(
        grads.empty() || (g.device() == grads[0].device() && g.dtype() == grads[0].dtype()), op,
        ": the gradients must share one device and dtype; parameter ", i, "'s is ", g.str(),
        ", the first one's ", grads[0].str());
    grads.push_back(std::move(g));
  }
  return grads;
}

// |g| elementwise, with ops (NaN stays NaN, -0 becomes 0).
Tensor magnitude(const Tensor& g) {
  return F::where(F::greater(g, zeros({}, g.dtype(), g.device())), g, F::neg(g));
}

// A gradient as rows that a static plan fuses an elementwise step into the reduction of (one
// pass, no temporary): rows of the longest length, from 64 up to the longest a fused CUDA
// reduction takes (kMaxCudaReduceRow; the cpu's take longer), that divides its element count,
// else one row.
Tensor as_rows(const Tensor& g) {
  const int64_t n = g.numel();
  for (int64_t r = std::min(n, kMaxCudaReduceRow); r >= 64; --r)
    if (n % r == 0) return F::reshape(g, {n / r, r});
  return F::flatten(g);
}

// The reduction of one gradient that the total combines: the sum of |g|^p (of g*g for p = 2,
// of |g| for p = 1), or for p = inf the largest |g|, as a [1] tensor; each row's, then the
// rows'.
Tensor partial(const Tensor& grad, double p) {
  if (std::isinf(p) && grad.numel() == 0) return zeros({1}, grad.dtype(), grad.device());
  const Tensor g = as_rows(grad);
  if (std::isinf(p)) return F::reshape(F::max(F::max(magnitude(g), {-1})), {1});
  const Tensor e = p == 2 ? F::mul(g, g) : p == 1 ? magnitude(g) : F::pow(magnitude(g), p);
  return F::reshape(F::sum(F::sum(e, {-1})), {1});
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  constexpr const char* kOp = "clip_grad_norm_";
  ENCORE_CHECK(norm_type > 0, kOp, ": norm_type must be positive (or INFINITY), got ", norm_type);
  ENCORE_CHECK(max_norm >= 0 && !std::isnan(max_norm), kOp, ": max_norm must be non-negative, got ",
               max_norm);
  const std::vector<Tensor> grads = grads_of(kOp, parameters);
  if (grads.empty()) return zeros({});
  NoGradGuard no_grad;
  std::vector<Tensor> parts;
  parts.reserve(grads.size());
  for (const Tensor& g : grads) parts.push_back(partial(g, norm_type));
  const Tensor all = parts.size() == 1 ? parts[0] : F::concat(parts);
  Tensor total;
  if (std::isinf(norm_type))
    total = F::max(all);
  else if (norm_type == 2)
    total = F::sqrt(F::sum(all));
  else if (norm_type == 1)
    total = F::sum(all);
  else
    total = F::pow(F::sum(all), 1 / norm_type);
  if (error_if_nonfinite) {
    const double t = total.item<double>();
    ENCORE_CHECK(std::isfinite(t), kOp, ": the total norm of order ", norm_type, " is ", t,
                 "; the gradients are left as they were");
  }
  const Tensor coef = F::div(max_norm, F::add(total, 1e-6));
  const Tensor one = ones({}, coef.dtype(), coef.device());
  const Tensor clamped = F::where(F::greater(coef, one), one, coef);
  for (const Tensor& g : grads) copy_(g, F::mul(g, clamped));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value) {
  constexpr const char* kOp = "clip_grad_value_";
  ENCORE_CHECK(clip_value >= 0, kOp, ": clip_value must be non-negative, got ", clip_value);
  const std::vector<Tensor> grads = grads_of(kOp, parameters);
  if (grads.empty()) return;
  NoGradGuard no_grad;
  const Tensor hi = full({}, clip_value, grads[0].dtype(), grads[0].device());
  const Tensor lo = F::neg(hi);
  for (const Tensor& g : grads)
    copy_(g, F::where(F::greater(g, hi), hi, F::where(F::greater(lo, g), lo, g)));
}

}  // namespace encore::nn
