// Embedding lookup and its backward definition.
#include "api/src/routine.h"

namespace encore {
namespace {

// gw [V, D] from the ids and gy [..., D]: a deterministic scatter-add (kernels/cpu/embedding.cc).
void embedding_backward(BackwardContext& c) {
  if (!c.needs_input_grad(1)) return;
  const Shape& weight = c.input_meta(1).shape;
  c.set_input_grad(1,
                   detail::call1(Op::EmbeddingGrad, {c.input(0), c.grad_output()}, weight,
                                 c.grad_output().dtype(), AttrBlob::of(c.attrs<EmbeddingAttrs>())));
}

const bool kRegistered = [] {
  register_backward(Op::Embedding, {embedding_backward, 0b1});
  return true;
}();

}  // namespace

namespace functions {

Tensor embedding(const Tensor& ids, const Tensor& weight, std::optional<int64_t> padding_idx) {
  constexpr const char* kName = "embedding";
  detail::check_defined(kName, "ids", ids);
  detail::check_floating(kName, "weight", weight);
  ENCORE_CHECK(is_integral(ids.dtype()), kName, ": argument 'ids' must be int32 or int64, it is ",
               ids.dtype(), " ", ids.shape());
  ENCORE_CHECK(weight.rank() == 2, kName, ": argument 'weight' must be 2-D [num, dim], it is ",
               weight.shape());
  const int64_t rows = weight.size(0);
  ENCORE_CHECK(!padding_idx || (*padding_idx >= -rows && *padding_idx < rows), kName,
               ": argument 'padding_idx' is ", padding_idx.value_or(0), ", outside [-", rows, ", ",
               rows, ") for weight ", weight.shape());
  ENCORE_CHECK(ids.rank() < Shape::kMaxRank, kName, ": argument 'ids' ", ids.shape(),
               " has too many dimensions to add the embedding's (at most ", Shape::kMaxRank - 1,
               ")");
  Shape out = ids.shape();
  out.push_back(weight.size(1));
  return detail::call1(Op::Embedding, {ids, weight}, out, weight.dtype(),
                       AttrBlob::of(EmbeddingAttrs{!padding_idx       ? -1
                                                   : *padding_idx < 0 ? *padding_idx + rows
                                                                      : *padding_idx}));
}

}  // namespace functions
}  // namespace encore
