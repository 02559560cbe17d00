// Routines: the user-facing ops. Each checks its arguments (throwing encore::Error that names
// the op, the argument and the shapes), allocates its outputs and calls dispatch(); the
// dispatcher runs the kernel, records autograd and notifies a tracer.
//
//   using namespace encore;
//   Tensor h = F::relu(F::linear(x, w1, b1));
//   Tensor loss = F::softmax_cross_entropy(F::linear(h, w2, b2), labels);
//   loss.backward();
//
// Floating ops accept float32 and float64; binary ops need equal dtypes and broadcast by NumPy
// rules. Axes may be negative.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/autograd.h"
#include "runtime/rng.h"
#include "runtime/tensor.h"

namespace encore {

// ---- Factories --------------------------------------------------------------------------
// A value for an integer dtype (full, tensor, fill_) must fit it, as in PyTorch: a NaN, an
// infinity or a value out of the dtype's range is an Error (a fraction is dropped, as copy_
// does). To bool, nonzero is true. A float32 fill (full, fill_, masked_fill) refuses a finite
// value beyond float32's range, as PyTorch's; tensor() makes it an infinity, as PyTorch's does.

Tensor empty(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::Float32,
            Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor ones(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu());
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// A tensor holding a copy of `values` (converted to `dtype`) with `shape`.
Tensor tensor(std::span<const double> values, const Shape& shape, DType dtype = DType::Float32,
              Device device = Device::cpu());
Tensor tensor(std::initializer_list<double> values, const Shape& shape,
              DType dtype = DType::Float32, Device device = Device::cpu());
// 0, 1, ..., n-1.
Tensor arange(int64_t n, DType dtype = DType::Float32, Device device = Device::cpu());
// Samples from the device's default generator: U[low, high) and N(mean, std^2).
Tensor rand(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu(),
            double low = 0, double high = 1);
Tensor randn(const Shape& shape, DType dtype = DType::Float32, Device device = Device::cpu(),
             double mean = 0, double std = 1);
// A copy with its own storage (differentiable).
Tensor clone(const Tensor& x);

// ---- In-place (not differentiable; bump the version counter) -----------------------------
// In grad mode, add_'s `other` or copy_'s `src` requiring grad is an Error: its gradient would
// be lost where PyTorch's in-place ops carry it (F::add, or .detach() where none should flow).

void fill_(const Tensor& t, double value);
void add_(const Tensor& t, const Tensor& other);   // t += other (other broadcast to t)
// Same shape; converts dtype as static_cast, made total: from floating to integer a NaN is 0 and
// values out of range saturate (as item() and to_vector() do).
void copy_(const Tensor& dst, const Tensor& src);
void uniform_(const Tensor& t, double low, double high);
void normal_(const Tensor& t, double mean, double std);

// A height and width: Size2(3) is 3x3, Size2(3, 1) is 3 high and 1 wide.
struct Size2 {
  int h = 0;
  int w = 0;
  Size2(int both) : h(both), w(both) {}  // NOLINT: implicit, so conv2d(x, w, b, 2, 1) reads well
  Size2(int height, int width) : h(height), w(width) {}
  bool operator==(const Size2&) const = default;
  std::string str() const { return std::to_string(h) + "x" + std::to_string(w); }  // "3x1"
};

namespace functions {

// ---- Elementwise ------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& x, double s);
Tensor sub(const Tensor& x, double s);
Tensor sub(double s, const Tensor& x);
Tensor mul(const Tensor& x, double s);
Tensor div(const Tensor& x, double s);
Tensor div(double s, const Tensor& x);
Tensor pow(const Tensor& x, double exponent);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
// x if x > 0 else 0; NaN stays NaN and its gradient passes gy through (as in PyTorch).
Tensor relu(const Tensor& x);
// x if x > 0 else slope * x (slope as in PyTorch: 0.01).
Tensor leaky_relu(const Tensor& x, double slope = 0.01);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
// GELU as torch.nn.functional.gelu. approximate "none": 0.5 x (1 + erf(x / sqrt 2));
// "tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Another string is an Error.
Tensor gelu(const Tensor& x, std::string_view approximate = "none");

// Comparisons give bool tensors (no gradient); where selects a where cond else b (broadcast).
Tensor equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// x with `value` where the bool `mask` (broadcast to x's shape) is true, as PyTorch's
// masked_fill; x's gradient is gy where mask is false, 0 where it is true.
//   Tensor s = F::masked_fill(scores, pad_mask, -INFINITY);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

// ---- Linear algebra ---------------------------------------------------------------------

// [..., M, K] x [..., K, N] -> [..., M, N], the batch dimensions (all but the last two)
// broadcast by NumPy rules: [B,H,T,D] x [B,H,D,S], [B,T,D] x [D,N], [H,T,D] x [B,1,D,S] ...
// An operand broadcast over batches gets its gradient summed back to its shape. Both at least
// 2-D. Through cblas (one GEMM over the rows of a when b has no batch), cuBLAS strided batched.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b with W [out, in], x [..., in], b [out] (optional).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- Reductions -------------------------------------------------------------------------

// Over `axes` (all axes when empty); keepdims keeps reduced axes with size 1. A 0-d tensor has
// one axis to name, 0 or -1, as in PyTorch (the result is 0-d).
Tensor sum(const Tensor& x, std::vector<int> axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, std::vector<int> axes = {}, bool keepdims = false);
// Maximum, NaN over a slice that holds one; the gradient is shared equally among tied maxima
// (as torch.amax: NaN over a slice whose maximum is NaN). Reducing over an axis of length 0 is
// an Error (no value to take); other axes may be empty: max of [0, 3] over axis 1 is [0].
Tensor max(const Tensor& x, std::vector<int> axes = {}, bool keepdims = false);
// Sums `x` down to `shape` (the reverse of broadcast_to); a copy when x already has `shape`.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- Layout -----------------------------------------------------------------------------

// A view with another shape; one dimension may be -1 (inferred).
Tensor reshape(const Tensor& x, std::span<const int64_t> shape);
Tensor reshape(const Tensor& x, std::initializer_list<int64_t> shape);
// Flattens dimensions start_dim..end_dim into one (a view).
Tensor flatten(const Tensor& x, int start_dim = 0, int end_dim = -1);
// permute, transpose and broadcast_to copy (see runtime/tensor.h), also when the result has x's
// shape and layout (an identity permutation, transpose(x, 1, 1)): never x itself.
Tensor permute(const Tensor& x, std::span<const int> perm);
Tensor permute(const Tensor& x, std::initializer_list<int> perm);
Tensor transpose(const Tensor& x, int dim0 = -2, int dim1 = -1);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor concat(std::span<const Tensor> xs, int axis = 0);
Tensor concat(std::initializer_list<Tensor> xs, int axis = 0);
// The inverse of concat: parts of `sizes[i]` entries along `axis`, in order (the sizes add up
// to x's extent there). Copies; the backward is one concat of the parts' gradients.
//   auto gates = F::split(g, {h, h, h, h}, -1);
std::vector<Tensor> split(const Tensor& x, std::span<const int64_t> sizes, int axis = 0);
std::vector<Tensor> split(const Tensor& x, std::initializer_list<int64_t> sizes, int axis = 0);
// `chunks` equal parts along `axis` (its extent must be a multiple of chunks), as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int axis = 0);
// Elements start, start+step, ... < stop along `axis` (step > 0; start/stop clamped, negative
// values count from the end as in Python).
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t stop, int64_t step = 1);

// ---- Softmax and losses -----------------------------------------------------------------

// Along `axis`; a 0-d tensor is one value along axis 0 or -1, as in PyTorch (softmax 1, log 0).
Tensor softmax(const Tensor& x, int axis = -1);
Tensor log_softmax(const Tensor& x, int axis = -1);
// Mean over samples of -log softmax(logits)[label]; logits [N,C], labels [N] int32/int64.
// Samples labelled `ignore_label` are left out of the sum and the count; 0 when every sample is
// ignored or there are none (PyTorch gives NaN).
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_label = -1);
// Mean over the positions whose target is not ignore_index of -log softmax(logits)[target]:
// logits [..., V] with the class axis LAST (PyTorch's cross_entropy takes it at axis 1:
// permute [N, V, T] logits first), targets [...] int32/int64, each in [0, V) or ignore_index.
// 0 when every position is ignored (PyTorch gives NaN).
//   Tensor loss = F::cross_entropy(logits, tokens);  // logits [B, T, V], tokens [B, T]
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// mean((a - b)^2) over all elements.
Tensor mean_squared_error(const Tensor& a, const Tensor& b);
// Fraction of samples whose argmax (a row's first NaN when it holds one, as torch.argmax) equals
// the label (ignored labels excluded; any other label outside [0, C) is an Error, as in
// softmax_cross_entropy). No gradient. 0 when every label is ignored (PyTorch gives NaN).
Tensor accuracy(const Tensor& logits, const Tensor& labels, int64_t ignore_label = -1);

// ---- Convolution and pooling (NCHW) ------------------------------------------------------

// Cross-correlation as PyTorch's conv2d: x [N,C,H,W], weight [O,C/groups,kh,kw], bias [O]
// (optional) -> [N,O,Ho,Wo], Ho = (H + 2 padding.h - dilation.h (kh-1) - 1) / stride.h + 1.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Size2 stride = 1, Size2 padding = 0, Size2 dilation = 1, int groups = 1);
// Whether every cpu convolution goes through im2col + GEMM instead of the register-blocked
// stride-1 kernels (to compare the two paths); returns the previous setting.
// ENCORE_CONV_IM2COL=1 in the environment turns it on when the library loads. Read by each
// eager call, but a static schedule's padded convolutions (ENCORE_STATIC_PADDED) keep the
// kernels of their trace: set it before a static function's first call.
bool set_conv_im2col(bool on);
// Maximum over each window (padding counts as -infinity); stride defaults to the kernel size,
// padding is at most half the kernel, the output size is floored. The gradient goes to the first
// maximum of each window in row-major order.
Tensor max_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0);
// Mean over each window; padded zeros count in the divisor unless count_include_pad is false.
Tensor avg_pool2d(const Tensor& x, Size2 kernel, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0, bool count_include_pad = true);
// Mean over height and width: [N,C,H,W] -> [N,C].
Tensor global_avg_pool2d(const Tensor& x);

// ---- Normalisation and dropout ----------------------------------------------------------

// Batch normalisation over axis 1 of x [N,C] or [N,C,H,W]: y = (x - mean) / sqrt(var + eps)
// * gamma + beta, with gamma and beta [C] (both or neither) and the statistics per channel.
// Training: normalises with the batch statistics (biased variance; more than one value per
// channel needed) and, when running_mean/running_var [C] are given, updates them in place:
// running = (1 - momentum) running + momentum batch (the variance unbiased), as PyTorch. Eval
// (training false): normalises with the running statistics, which are then required.
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                  const Tensor& gamma, const Tensor& beta, bool training, double momentum = 0.1,
                  double eps = 1e-5);
// Training: zeroes each element with probability `ratio` (drawn from the device's generator)
// and scales the others by 1/(1-ratio). Eval (training false): x itself.
Tensor dropout(const Tensor& x, double ratio = 0.5, bool training = true);

// ---- Sequence models ----------------------------------------------------------------------

// Rows of `weight` [V, D] by index, as torch.nn.functional.embedding: ids [...] (int32 or int64,
// each in [0, V)) -> [..., D]. The gradient goes to weight only, summed over repeated ids in id
// order (the same bits on every run and thread count), none to row padding_idx (in [-V, V), a
// negative one counting from the end, as PyTorch's; none by default). On the cpu an id outside
// [0, V) is an Error; on CUDA its output row is NaN.
//   Tensor e = F::embedding(tokens, table);  // tokens [B, T] -> e [B, T, D]
Tensor embedding(const Tensor& ids, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt);

// Layer normalisation as torch.nn.functional.layer_norm: over the trailing dimensions of x named
// by normalized_shape, y = (x - mean) / sqrt(var + eps) * gamma + beta, the variance biased;
// gamma and beta (each optional) have shape normalized_shape and x's dtype. Each row's mean and
// 1/sqrt(var + eps) are kept for the backward; results have the same bits at any thread count.
//   Tensor h = F::layer_norm(x, {d_model}, gamma, beta);  // x [B, T, d_model]
Tensor layer_norm(const Tensor& x, std::span<const int64_t> normalized_shape,
                  const Tensor& gamma = Tensor(), const Tensor& beta = Tensor(), double eps = 1e-5);
Tensor layer_norm(const Tensor& x, std::initializer_list<int64_t> normalized_shape,
                  const Tensor& gamma = Tensor(), const Tensor& beta = Tensor(), double eps = 1e-5);

// softmax(q k^T scale + mask) v, as torch.nn.functional.scaled_dot_product_attention (math
// form, no dropout): q [..., T, D], k [..., S, D], v [..., S, Dv] -> [..., T, Dv], the batch
// dimensions broadcast. scale defaults to 1/sqrt(D). causal: query i attends to keys j <= i
// (top-left aligned, PyTorch's is_causal). attn_mask, broadcast to [..., T, S]: bool, true where
// a key TAKES PART (PyTorch's convention), or floating (q's dtype), added to the scores. A query
// that the mask lets attend to no key gets 0, its gradients too (as PyTorch's since 2.5; a
// causal mask alone leaves every query key 0). causal and attn_mask may be given together: both
// apply (PyTorch refuses the pair). Composed from matmul, mul, masked_fill, where, softmax:
// differentiable in q, k, v (and a floating mask), and traceable by static_graph.
//   Tensor y = F::scaled_dot_product_attention(q, k, v, /*causal=*/true);  // q,k,v [B,H,T,Dh]
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = false, const Tensor& attn_mask = Tensor(),
                                    std::optional<double> scale = std::nullopt);

}  // namespace functions

namespace F = functions;

// ---- Operators --------------------------------------------------------------------------

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return F::add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return F::sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return F::mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return F::div(a, b);
}
inline Tensor operator+(const Tensor& x, double s) {
  return F::add(x, s);
}
inline Tensor operator+(double s, const Tensor& x) {
  return F::add(x, s);
}
inline Tensor operator-(const Tensor& x, double s) {
  return F::sub(x, s);
}
inline Tensor operator-(double s, const Tensor& x) {
  return F::sub(s, x);
}
inline Tensor operator*(const Tensor& x, double s) {
  return F::mul(x, s);
}
inline Tensor operator*(double s, const Tensor& x) {
  return F::mul(x, s);
}
inline Tensor operator/(const Tensor& x, double s) {
  return F::div(x, s);
}
inline Tensor operator/(double s, const Tensor& x) {
  return F::div(s, x);
}
inline Tensor operator-(const Tensor& x) {
  return F::neg(x);
}

}  // namespace encore
