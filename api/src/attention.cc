// masked_fill and scaled dot-product attention, composed from routines (where, batched matmul,
// softmax): autograd and static tracing need nothing of their own.
#include <cmath>
#include <limits>

#include "api/src/routine.h"

namespace encore {
namespace F = functions;
using detail::check_floating;

namespace {

constexpr const char* kAttention = "scaled_dot_product_attention";

// Whether `from` broadcasts to exactly `to` (NumPy rules).
bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.rank() > to.rank()) return false;
  const int lead = to.rank() - from.rank();
  for (int i = 0; i < from.rank(); ++i)
    if (from[i] != 1 && from[i] != to[i + lead]) return false;
  return true;
}

// Whether the batch dimensions (all but the last two) of a and b broadcast together.
bool batches_broadcast(const Shape& a, const Shape& b) {
  const int ra = a.rank() - 2, rb = b.rank() - 2;
  for (int i = 1; i <= std::min(ra, rb); ++i) {
    const int64_t da = a[ra - i], db = b[rb - i];
    if (da != db && da != 1 && db != 1) return false;
  }
  return true;
}

// The elements of causal attention's [T, S] scores that are masked out: key j > query i.
Tensor causal_mask(int64_t t, int64_t s, DType dtype, Device device) {
  const Tensor rows = F::reshape(arange(t, dtype, device), {t, 1});
  const Tensor cols = F::reshape(arange(s, dtype, device), {1, s});
  return F::greater(cols, rows);
}

}  // namespace

namespace functions {

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_floating("masked_fill", "x", x);
  detail::check_defined("masked_fill", "mask", mask);
  ENCORE_CHECK(mask.dtype() == DType::Bool, "masked_fill: argument 'mask' must be bool, it is ",
               mask.dtype(), " ", mask.shape());
  ENCORE_CHECK(broadcasts_to(mask.shape(), x.shape()), "masked_fill: argument 'mask' ",
               mask.shape(), " does not broadcast to x ", x.shape());
  detail::check_fill_value("masked_fill", value, x.dtype());
  return where(mask, full({}, value, x.dtype(), x.device()), x);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    const Tensor& attn_mask, std::optional<double> scale) {
  check_floating(kAttention, "q", q);
  check_floating(kAttention, "k", k);
  check_floating(kAttention, "v", v);
  ENCORE_CHECK(q.dtype() == k.dtype() && k.dtype() == v.dtype(), kAttention,
               ": dtypes differ: q is ", q.dtype(), " ", q.shape(), ", k is ", k.dtype(), " ",
               k.shape(), ", v is ", v.dtype(), " ", v.shape());
  ENCORE_CHECK(q.rank() >= 2 && k.rank() >= 2 && v.rank() >= 2, kAttention,
               ": q, k and v must be at least 2-D [..., length, features]: q is ", q.shape(),
               ", k is ", k.shape(), ", v is ", v.shape());
  ENCORE_CHECK(q.size(-1) == k.size(-1), kAttention, ": head sizes differ: q is ", q.shape(),
               ", k is ", k.shape(), " (expected q [..., T, D] and k [..., S, D])");
  ENCORE_CHECK(k.size(-2) == v.size(-2), kAttention, ": key and value lengths differ: k is ",
               k.shape(), ", v is ", v.shape(), " (expected k [..., S, D] and v [..., S, Dv])");
  ENCORE_CHECK(batches_broadcast(q.shape(), k.shape()) && batches_broadcast(q.shape(), v.shape()) &&
                   batches_broadcast(k.shape(), v.shape()),
               kAttention, ": batch dimensions do not broadcast: q is ", q.shape(), ", k is ",
               k.shape(), ", v is ", v.shape());
  const int64_t t = q.size(-2), s = k.size(-2);
  const double factor =
      scale ? *scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(1, q.size(-1))));
  Tensor scores = mul(detail::batched_matmul(kAttention, q, k, false, true), factor);
  if (attn_mask.defined()) {
    ENCORE_CHECK(attn_mask.dtype() == DType::Bool || attn_mask.dtype() == q.dtype(), kAttention,
                 ": argument 'attn_mask' must be bool or ", q.dtype(), " (as q), it is ",
                 attn_mask.dtype(), " ", attn_mask.shape());
    ENCORE_CHECK(broadcasts_to(attn_mask.shape(), scores.shape()), kAttention,
                 ": argument 'attn_mask' ", attn_mask.shape(), " does not broadcast to the scores ",
                 scores.shape(), " (q ", q.shape(), ", k ", k.shape(), ")");
  }
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  if (causal) scores = masked_fill(scores, causal_mask(t, s, q.dtype(), q.device()), kMinusInf);
  if (!attn_mask.defined())  // (a causal mask alone leaves every query key 0)
    return detail::batched_matmul(kAttention, softmax(scores, -1), v, false, false);
  scores = attn_mask.dtype() == DType::Bool
               ? where(attn_mask, scores, full({}, kMinusInf, q.dtype(), q.device()))
               : add(scores, attn_mask);
  // A query the masks leave no key attends to nothing: its probabilities are 0 (PyTorch's safe
  // softmax), not softmax's NaN, which a backward would spread through P^T gy to every row of
  // v's gradient. Its scores are replaced by 0 before the softmax as well, so that no NaN
  // arises on the way back either. (A NaN score is no -inf: its row stays NaN.)
  Tensor dead;
  {
    NoGradGuard no_grad;
    dead = equal(max(scores, {-1}, true), full({}, kMinusInf, q.dtype(), q.device()));
  }
  const Tensor zero = zeros({}, q.dtype(), q.device());
  const Tensor p = where(dead, zero, softmax(where(dead, zero, scores), -1));
  return detail::batched_matmul(kAttention, p, v, false, false);
}

}  // namespace functions
}  // namespace encore
