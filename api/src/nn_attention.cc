#include <cmath>

#include "api/src/routine.h"
#include "encore/nn_sequence.h"

namespace encore::nn {

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t num_heads,
                                       AttentionOptions options)
    : options(options), heads_(num_heads) {
  ENCORE_CHECK(embed_dim > 0 && num_heads > 0 && embed_dim % num_heads == 0,
               "MultiheadAttention: embed_dim must be a positive multiple of num_heads, got ",
               embed_dim, " and ", num_heads);
  ENCORE_CHECK(is_floating(options.dtype),
               "MultiheadAttention: dtype must be float32 or float64, it is ", options.dtype);
  const double bound = std::sqrt(6.0 / static_cast<double>(4 * embed_dim));  // xavier uniform
  in_proj_weight = rand({3 * embed_dim, embed_dim}, options.dtype, options.device, -bound, bound);
  register_parameter("in_proj_weight", &in_proj_weight);
  if (options.bias) {
    in_proj_bias = zeros({3 * embed_dim}, options.dtype, options.device);
    register_parameter("in_proj_bias", &in_proj_bias);
  }
  out_proj = register_module(
      "out_proj", std::make_shared<Linear>(embed_dim, embed_dim,
                                           LinearOptions{.bias = options.bias,
                                                         .dtype = options.dtype,
                                                         .device = options.device}));
  if (options.bias) {
    NoGradGuard no_grad;
    fill_(out_proj->bias, 0.0);
  }
}

Tensor MultiheadAttention::split_heads(const Tensor& t) const {
  const int64_t e = in_proj_weight.size(1);
  return F::permute(F::reshape(t, {t.size(0), t.size(1), heads_, e / heads_}), {0, 2, 1, 3});
}

Tensor MultiheadAttention::attend(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& attn_mask, bool causal) {
  const Tensor y = F::scaled_dot_product_attention(split_heads(q), split_heads(k),
                                                   split_heads(v), causal, attn_mask);
  // [B, heads, T, d] -> [B, T, heads, d] -> [B, T, embed].
  const Tensor merged = F::permute(y, {0, 2, 1, 3});
  return (*out_proj)(F::reshape(merged, {q.size(0), q.size(1), in_proj_weight.size(1)}));
}

Tensor MultiheadAttention::forward(const Tensor& x) {
  detail::check_floating("MultiheadAttention", "x", x);
  ENCORE_CHECK(x.dtype() == in_proj_weight.dtype(), "MultiheadAttention: x is ", x.dtype(),
               " but the module's weights are ", in_proj_weight.dtype());
  const int64_t e = in_proj_weight.size(1);
  ENCORE_CHECK(x.rank() == 3 && x.size(2) == e, "MultiheadAttention: x must be [B,T,", e,
               "], it is ", x.shape());
  // One product for q, k and v.
  const std::vector<Tensor> qkv = F::chunk(F::linear(x, in_proj_weight, in_proj_bias), 3, 2);
  return attend(qkv[0], qkv[1], qkv[2], Tensor(), options.causal);
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& attn_mask, bool causal) {
  const int64_t e = in_proj_weight.size(1);
  const char* names[] = {"query", "key", "value"};
  const Tensor* args[] = {&query, &key, &value};
  for (int i = 0; i < 3; ++i) {
    detail::check_floating("MultiheadAttention", names[i], *args[i]);
    ENCORE_CHECK(args[i]->dtype() == in_proj_weight.dtype(), "MultiheadAttention: ", names[i],
                 " is ", args[i]->dtype(), " but the module's weights are ",
                 in_proj_weight.dtype());
    ENCORE_CHECK(args[i]->rank() == 3 && args[i]->size(2) == e, "MultiheadAttention: ", names[i],
                 " must be [B,", i == 0 ? "T" : "S", ",", e, "], it is ", args[i]->shape());
  }
  ENCORE_CHECK(key.size(0) == query.size(0) && value.size(0) == query.size(0) &&
                   key.size(1) == value.size(1),
               "MultiheadAttention: key ", key.shape(), " and value ", value.shape(), " must be [",
               query.size(0), ",S,", e, "] for query ", query.shape());
  auto project = [&](const Tensor& t, int64_t part) {
    const Tensor w = F::slice(in_proj_weight, 0, part * e, (part + 1) * e);
    return F::linear(t, w,
                     in_proj_bias.defined() ? F::slice(in_proj_bias, 0, part * e, (part + 1) * e)
                                            : Tensor());
  };
  return attend(project(query, 0), project(key, 1), project(value, 2), attn_mask,
                causal || options.causal);
}

std::string MultiheadAttention::describe() const {
  return cat("MultiheadAttention(", in_proj_weight.size(1), ", heads ", heads_,
             options.causal ? ", causal" : "", ")");
}

TransformerBlock::TransformerBlock(int64_t width, int64_t heads, TransformerBlockOptions options)
    : options(options) {
  ENCORE_CHECK(options.mlp_ratio > 0, "TransformerBlock: mlp_ratio must be positive, got ",
               options.mlp_ratio);
  ENCORE_CHECK(options.gelu == "tanh" || options.gelu == "none",
               "TransformerBlock: gelu must be tanh or none, it is ", options.gelu);
  const LinearOptions lin{.dtype = options.dtype, .device = options.device};
  auto layer_norm = [&] {
    return std::make_shared<LayerNorm>(std::vector<int64_t>{width}, 1e-5, true, options.dtype,
                                       options.device);
  };
  ln1 = register_module("ln1", layer_norm());
  attn = register_module(
      "attn", std::make_shared<MultiheadAttention>(
                  width, heads,
                  AttentionOptions{
                      .causal = options.causal, .dtype = options.dtype, .device = options.device}));
  ln2 = register_module("ln2", layer_norm());
  fc1 = register_module("fc1", std::make_shared<Linear>(width, options.mlp_ratio * width, lin));
  fc2 = register_module("fc2", std::make_shared<Linear>(options.mlp_ratio * width, width, lin));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  const Tensor h = F::add(x, (*attn)((*ln1)(x)));
  return F::add(h, (*fc2)(F::gelu((*fc1)((*ln2)(h)), options.gelu)));
}

std::string TransformerBlock::describe() const {
  return cat("TransformerBlock(", fc1->weight.size(1), ", ", attn->describe(), ", mlp ",
             fc1->weight.size(0), ")");
}

}  // namespace encore::nn
