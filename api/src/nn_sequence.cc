#include "encore/nn_sequence.h"

#include <cmath>

#include "api/src/routine.h"

namespace encore::nn {

namespace {

// U(-1/sqrt(hidden), 1/sqrt(hidden)), as PyTorch initialises every recurrent parameter.
Tensor recurrent_parameter(const Shape& shape, int64_t hidden, DType dtype, Device device) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  return rand(shape, dtype, device, -bound, bound);
}

void check_sizes(const char* module, int64_t input_size, int64_t hidden_size, DType dtype) {
  ENCORE_CHECK(input_size > 0 && hidden_size > 0, module,
               ": input_size and hidden_size must be positive, got ", input_size, " and ",
               hidden_size);
  ENCORE_CHECK(is_floating(dtype), module, ": dtype must be float32 or float64, it is ", dtype);
}

// Checks that an input or state argument has the weights' dtype.
void check_dtype(const char* module, const char* what, const Tensor& t, DType weights) {
  ENCORE_CHECK(t.dtype() == weights, module, ": ", what, " must be ", weights,
               " as the weights, it is ", t.dtype(), " ", t.shape());
}

// Checks a state argument [B, hidden] of a cell (undefined: a zero state, as PyTorch's default).
void check_state(const char* what, const Tensor& s, int64_t batch, int64_t hidden, const Tensor& x,
                 DType weights) {
  if (!s.defined()) return;
  ENCORE_CHECK(s.rank() == 2 && s.size(0) == batch && s.size(1) == hidden, "LSTMCell: ", what,
               " must be [", batch, ",", hidden, "] for x ", x.shape(), ", it is ", s.shape());
  check_dtype("LSTMCell", what, s, weights);
}

}  // namespace

std::pair<Tensor, Tensor> lstm_state(const Tensor& gates, const Tensor& c) {
  detail::check_floating("lstm_state", "gates", gates);
  ENCORE_CHECK(gates.rank() == 2 && gates.size(1) % 4 == 0,
               "lstm_state: gates must be [B,4*hidden], it is ", gates.shape());
  const int64_t h = gates.size(1) / 4;
  ENCORE_CHECK(!c.defined() || c.shape() == Shape({gates.size(0), h}), "lstm_state: c must be [",
               gates.size(0), ",", h, "] for gates ", gates.shape(), ", it is ", c.shape());
  // One split: its backward is one concat of the four gates' gradients.
  const std::vector<Tensor> parts = F::chunk(gates, 4, 1);
  const Tensor i = F::sigmoid(parts[0]);
  const Tensor f = F::sigmoid(parts[1]);
  const Tensor g = F::tanh(parts[2]);
  const Tensor o = F::sigmoid(parts[3]);
  // An undefined c is a zero state: f * 0 (NaN where f is, as a zero tensor would give).
  const Tensor c_next = F::add(c.defined() ? F::mul(f, c) : F::mul(f, 0.0), F::mul(i, g));
  return {F::mul(o, F::tanh(c_next)), c_next};
}

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, RecurrentOptions options) {
  check_sizes("LSTMCell", input_size, hidden_size, options.dtype);
  const int64_t h4 = 4 * hidden_size;
  weight_ih = recurrent_parameter({h4, input_size}, hidden_size, options.dtype, options.device);
  weight_hh = recurrent_parameter({h4, hidden_size}, hidden_size, options.dtype, options.device);
  register_parameter("weight_ih", &weight_ih);
  register_parameter("weight_hh", &weight_hh);
  if (options.bias) {
    bias_ih = recurrent_parameter({h4}, hidden_size, options.dtype, options.device);
    bias_hh = recurrent_parameter({h4}, hidden_size, options.dtype, options.device);
    register_parameter("bias_ih", &bias_ih);
    register_parameter("bias_hh", &bias_hh);
  }
}

std::pair<Tensor, Tensor> LSTMCell::forward(const Tensor& x, const Tensor& h, const Tensor& c) {
  detail::check_floating("LSTMCell", "x", x);
  ENCORE_CHECK(x.rank() == 2 && x.size(1) == weight_ih.size(1), "LSTMCell: x must be [B,",
               weight_ih.size(1), "], it is ", x.shape());
  check_dtype("LSTMCell", "x", x, weight_ih.dtype());
  check_state("h", h, x.size(0), hidden_size(), x, weight_ih.dtype());
  check_state("c", c, x.size(0), hidden_size(), x, weight_ih.dtype());
  // A missing h is a zero state, multiplied by weight_hh all the same (a NaN there shows, as in
  // PyTorch); a missing c is lstm_state's zero state.
  const Tensor h0 =
      h.defined() ? h : zeros({x.size(0), hidden_size()}, weight_hh.dtype(), weight_hh.device());
  const Tensor gates = F::add(F::linear(x, weight_ih, bias_ih), F::linear(h0, weight_hh, bias_hh));
  return lstm_state(gates, c);
}

std::string LSTMCell::describe() const {
  return cat("LSTMCell(", weight_ih.size(1), ", ", hidden_size(), ")");
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, LSTMOptions options)
    : options(options), input_size_(input_size), hidden_size_(hidden_size) {
  check_sizes("LSTM", input_size, hidden_size, options.dtype);
  ENCORE_CHECK(options.num_layers >= 1, "LSTM: num_layers must be at least 1, got ",
               options.num_layers);
  const auto layers = static_cast<size_t>(options.num_layers);
  // Registered by address: the vectors are sized once, never grown.
  weight_ih.resize(layers);
  weight_hh.resize(layers);
  bias_ih.resize(layers);
  bias_hh.resize(layers);
  const int64_t h4 = 4 * hidden_size;
  for (size_t k = 0; k < layers; ++k) {
    const int64_t in = k == 0 ? input_size : hidden_size;
    weight_ih[k] = recurrent_parameter({h4, in}, hidden_size, options.dtype, options.device);
    weight_hh[k] = recurrent_parameter({h4, hidden_size}, hidden_size, options.dtype,
                                       options.device);
    register_parameter(cat("weight_ih_l", k), &weight_ih[k]);
    register_parameter(cat("weight_hh_l", k), &weight_hh[k]);
    if (options.bias) {
      bias_ih[k] = recurrent_parameter({h4}, hidden_size, options.dtype, options.device);
      bias_hh[k] = recurrent_parameter({h4}, hidden_size, options.dtype, options.device);
      register_parameter(cat("bias_ih_l", k), &bias_ih[k]);
      register_parameter(cat("bias_hh_l", k), &bias_hh[k]);
    }
  }
}

std::tuple<Tensor, Tensor, Tensor> LSTM::forward(const Tensor& x, const Tensor& h0,
                                                 const Tensor& c0) {
  detail::check_floating("LSTM", "x", x);
  ENCORE_CHECK(x.rank() == 3 && x.size(2) == input_size_, "LSTM: x must be [",
               options.batch_first ? "B,T," : "T,B,", input_size_, "], it is ", x.shape());
  check_dtype("LSTM", "x", x, weight_ih[0].dtype());
  const int time_axis = options.batch_first ? 1 : 0;
  const int64_t steps = x.size(time_axis), batch = x.size(1 - time_axis);
  ENCORE_CHECK(steps > 0, "LSTM: x ", x.shape(), " has no time steps");
  const Shape state_shape({options.num_layers, batch, hidden_size_});
  ENCORE_CHECK(h0.defined() == c0.defined(), "LSTM: give both h0 and c0 or neither");
  if (h0.defined()) {
    ENCORE_CHECK(h0.shape() == state_shape, "LSTM: h0 must be ", state_shape, ", it is ",
                 h0.shape());
    ENCORE_CHECK(c0.shape() == state_shape, "LSTM: c0 must be ", state_shape, ", it is ",
                 c0.shape());
    check_dtype("LSTM", "h0", h0, weight_ih[0].dtype());
    check_dtype("LSTM", "c0", c0, weight_ih[0].dtype());
  }
  // A step's [B, n] as one slice of the sequence: [1, B, n] or [B, 1, n].
  auto as_step = [&](const Tensor& t) {
    return options.batch_first ? F::reshape(t, {batch, 1, t.size(1)})
                               : F::reshape(t, {1, batch, t.size(1)});
  };
  std::vector<Tensor> h_layers, c_layers;  // the given initial states, per layer
  if (h0.defined()) {
    h_layers = F::chunk(h0, options.num_layers, 0);
    c_layers = F::chunk(c0, options.num_layers, 0);
  }
  Tensor input = x;
  std::vector<Tensor> h_last, c_last, outputs(static_cast<size_t>(steps));
  for (size_t k = 0; k < weight_ih.size(); ++k) {
    // Every step's input projection in one product over T x B rows, split into the steps' parts
    // at once (so the backward joins their gradients with concats, no zero-filled copies).
    const std::vector<Tensor> projected =
        F::chunk(F::linear(input, weight_ih[k], bias_ih[k]), steps, time_axis);
    // No initial state is a zero one, computed with as given (not left out): 0 times a NaN or
    // infinite weight is NaN, as in PyTorch.
    Tensor h, c;
    if (h0.defined()) {
      h = F::reshape(h_layers[k], {batch, hidden_size_});
      c = F::reshape(c_layers[k], {batch, hidden_size_});
    } else {
      h = zeros({batch, hidden_size_}, x.dtype(), x.device());
      c = zeros({batch, hidden_size_}, x.dtype(), x.device());
    }
    for (int64_t t = 0; t < steps; ++t) {
      Tensor gates = F::reshape(projected[static_cast<size_t>(t)], {batch, 4 * hidden_size_});
      gates = F::add(gates, F::linear(h, weight_hh[k], bias_hh[k]));
      std::tie(h, c) = lstm_state(gates, c);
      outputs[static_cast<size_t>(t)] = as_step(h);
    }
    h_last.push_back(F::reshape(h, {1, batch, hidden_size_}));
    c_last.push_back(F::reshape(c, {1, batch, hidden_size_}));
    input = F::concat(outputs, time_axis);
  }
  return {input, F::concat(h_last, 0), F::concat(c_last, 0)};
}

std::string LSTM::describe() const {
  return cat("LSTM(", input_size_, ", ", hidden_size_,
             options.num_layers > 1 ? cat(", layers ", options.num_layers) : std::string(),
             options.batch_first ? ", batch_first" : "", ")");
}

}  // namespace encore::nn
