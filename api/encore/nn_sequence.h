// Modules of sequence models: recurrent cells and layers, attention and a transformer block.
//
//   nn::LSTMCell cell(64, 256);
//   Tensor h = zeros({B, 256}), c = zeros({B, 256});
//   std::tie(h, c) = cell(x_t, h, c);             // one time step, PyTorch's gate order
//   nn::LSTM lstm(64, 256, {.batch_first = true});
//   auto [y, h_n, c_n] = lstm(x);                  // x [B,T,64] -> y [B,T,256]
//
// The loops over time are C++ in forward(): a static function or ENCORE_STATIC_GRAPH records
// every step of them, so a replay runs the whole unrolled sequence as one schedule.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "encore/nn.h"

namespace encore::nn {

struct RecurrentOptions {
  bool bias = true;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// One LSTM step as torch.nn.LSTMCell: gates = x W_ih^T + b_ih + h W_hh^T + b_hh split into
// input, forget, cell and output gates (that order); c' = sigmoid(f) c + sigmoid(i) tanh(g),
// h' = sigmoid(o) tanh(c'). x [B, input], h and c [B, hidden], all of the weights' dtype; an
// undefined h or c is a zero state (PyTorch's default).
// Parameters as PyTorch's, U(-1/sqrt(hidden), 1/sqrt(hidden)): weight_ih [4 hidden, input],
// weight_hh [4 hidden, hidden], bias_ih and bias_hh [4 hidden].
class LSTMCell : public Module {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, RecurrentOptions options = {});
  // (h', c').
  std::pair<Tensor, Tensor> forward(const Tensor& x, const Tensor& h, const Tensor& c);
  std::pair<Tensor, Tensor> operator()(const Tensor& x, const Tensor& h, const Tensor& c) {
    return forward(x, h, c);
  }
  std::string describe() const override;
  int64_t hidden_size() const { return weight_hh.size(1); }

  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
};

// The state update of an LSTM from its gates [B, 4 hidden] (input, forget, cell, output) and the
// cell state c [B, hidden]: (h', c'). LSTMCell and LSTM use it; so can a user's own cell.
std::pair<Tensor, Tensor> lstm_state(const Tensor& gates, const Tensor& c);

struct LSTMOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;  // x [B,T,input] instead of [T,B,input], as PyTorch's
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// A multi-layer LSTM over a whole sequence, as torch.nn.LSTM (unidirectional, no dropout):
// x [T,B,input] ([B,T,input] with batch_first) -> y, the last layer's h at every step, and
// h_n, c_n [layers, B, hidden]. Each layer projects all its inputs at once (one product over
// T x B rows), then steps through time. Parameters per layer k: weight_ih_l{k}, weight_hh_l{k},
// bias_ih_l{k}, bias_hh_l{k}.
class LSTM : public Module {
 public:
  LSTM(int64_t input_size, int64_t hidden_size, LSTMOptions options = {});
  // (y, h_n, c_n). Initial states h0, c0 [layers, B, hidden]; undefined: zeros. x, h0 and c0
  // have the weights' dtype.
  std::tuple<Tensor, Tensor, Tensor> forward(const Tensor& x, const Tensor& h0 = Tensor(),
                                             const Tensor& c0 = Tensor());
  std::tuple<Tensor, Tensor, Tensor> operator()(const Tensor& x, const Tensor& h0 = Tensor(),
                                                const Tensor& c0 = Tensor()) {
    return forward(x, h0, c0);
  }
  std::string describe() const override;

  const LSTMOptions options;
  std::vector<Tensor> weight_ih, weight_hh, bias_ih, bias_hh;  // per layer

 private:
  int64_t input_size_, hidden_size_;
};

struct AttentionOptions {
  bool bias = true;
  bool causal = false;  // self-attention forward(x): position i attends to j <= i
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// Multi-head attention as torch.nn.MultiheadAttention with batch_first (no dropout): inputs
// [B, T, embed], q, k, v projected by in_proj_weight [3 embed, embed] (+ in_proj_bias), split
// into `heads` heads of embed / heads, F::scaled_dot_product_attention per head, concatenated
// and projected by out_proj. Weights xavier-uniform, biases zero, as PyTorch's.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, AttentionOptions options = {});
  // Self-attention (causal when options.causal).
  Tensor forward(const Tensor& x) override;
  // query [B,T,embed], key and value [B,S,embed], the same B (no broadcast) and S; attn_mask as
  // scaled_dot_product_attention's: a bool mask is true where a query may attend, the inverse of
  // torch.nn.MultiheadAttention's (true = masked out); a float mask is added to the scores. It
  // broadcasts to [B, heads, T, S]: key padding is a bool [B, 1, 1, S] (true for real keys; a
  // [B, S] mask would broadcast as [T, S]). Causal when `causal` or options.causal.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& attn_mask = Tensor(), bool causal = false);
  std::string describe() const override;

  Tensor in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;
  const AttentionOptions options;

 private:
  // [B, T, embed] -> [B, heads, T, embed / heads].
  Tensor split_heads(const Tensor& t) const;
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                bool causal);
  int64_t heads_;
};

struct TransformerBlockOptions {
  int64_t mlp_ratio = 4;               // the MLP's hidden width over the block's width
  std::string gelu = "tanh";           // F::gelu's approximate: "tanh" (GPT-2's) or "none"
  bool causal = true;
  DType dtype = DType::Float32;
  Device device = Device::cpu();
};

// A pre-norm transformer block (GPT-2's): x + attn(ln1(x)), then + fc2(gelu(fc1(ln2(x)))).
class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t width, int64_t heads, TransformerBlockOptions options = {});
  Tensor forward(const Tensor& x) override;  // [B, T, width] -> [B, T, width]
  std::string describe() const override;

  std::shared_ptr<LayerNorm> ln1, ln2;
  std::shared_ptr<MultiheadAttention> attn;
  std::shared_ptr<Linear> fc1, fc2;
  const TransformerBlockOptions options;
};

}  // namespace encore::nn
