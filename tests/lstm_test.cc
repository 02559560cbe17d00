// nn::LSTMCell and nn::LSTM: PyTorch's gate order against a plain-loop reference, gradients
// against central differences, the layer against stepping the cell, errors, and a module whose
// forward takes and returns several tensors made static with ENCORE_STATIC_GRAPH.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "encore/encore.h"
#include "tests/test_util.h"

using namespace encore;
using Catch::Matchers::Contains;
using testing::bit_diff;
using testing::error_of;
using testing::StaticEnabled;

namespace {

double sigmoid(double v) {
  return 1 / (1 + std::exp(-v));
}

// One step of the LSTM with plain loops over host copies (float64): (h', c').
std::pair<std::vector<double>, std::vector<double>> reference_step(const nn::LSTMCell& cell,
                                                                   const Tensor& x,
                                                                   const Tensor& h,
                                                                   const Tensor& c) {
  const auto wi = cell.weight_ih.to_vector<double>(), wh = cell.weight_hh.to_vector<double>();
  const auto bi = cell.bias_ih.to_vector<double>(), bh = cell.bias_hh.to_vector<double>();
  const auto xv = x.to_vector<double>(), hv = h.to_vector<double>(), cv = c.to_vector<double>();
  const int64_t batch = x.size(0), in = x.size(1), hid = h.size(1);
  std::vector<double> h2(static_cast<size_t>(batch * hid)), c2(h2.size());
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<double> g(static_cast<size_t>(4 * hid));
    for (int64_t r = 0; r < 4 * hid; ++r) {
      double s = bi[r] + bh[r];
      for (int64_t k = 0; k < in; ++k) s += wi[r * in + k] * xv[b * in + k];
      for (int64_t k = 0; k < hid; ++k) s += wh[r * hid + k] * hv[b * hid + k];
      g[r] = s;
    }
    for (int64_t j = 0; j < hid; ++j) {
      const double i = sigmoid(g[j]), f = sigmoid(g[hid + j]), gg = std::tanh(g[2 * hid + j]),
                   o = sigmoid(g[3 * hid + j]);
      const double cn = f * cv[b * hid + j] + i * gg;
      c2[b * hid + j] = cn;
      h2[b * hid + j] = o * std::tanh(cn);
    }
  }
  return {h2, c2};
}

void check_close(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(tol));
}

// A cell whose forward (three tensors in, two out) is static.
struct StaticCell : nn::LSTMCell {
  using LSTMCell::LSTMCell;
  ENCORE_STATIC_GRAPH({.name = "static_cell", .arg_names = {"x", "h", "c"}});
};

}  // namespace

TEST_CASE("LSTMCell follows PyTorch's gate order (input, forget, cell, output)", "[lstm]") {
  nn::LSTMCell cell(3, 4, {.dtype = DType::Float64});
  CHECK(cell.weight_ih.shape() == Shape({16, 3}));
  CHECK(cell.weight_hh.shape() == Shape({16, 4}));
  CHECK(cell.named_parameters().size() == 4);
  const Tensor x = randn({2, 3}, DType::Float64), h = randn({2, 4}, DType::Float64),
               c = randn({2, 4}, DType::Float64);
  const auto [h2, c2] = cell(x, h, c);
  const auto [rh, rc] = reference_step(cell, x, h, c);
  check_close(h2.to_vector<double>(), rh, 1e-12);
  check_close(c2.to_vector<double>(), rc, 1e-12);
}

TEST_CASE("LSTMCell's gradients match central differences", "[lstm]") {
  nn::LSTMCell cell(3, 2, {.dtype = DType::Float64});
  const Tensor x = randn({2, 3}, DType::Float64), h = randn({2, 2}, DType::Float64),
               c = randn({2, 2}, DType::Float64);
  const Tensor wy = randn({2, 2}, DType::Float64), wc = randn({2, 2}, DType::Float64);
  auto loss = [&] {
    const auto [h2, c2] = cell(x, h, c);
    return F::add(F::sum(F::mul(h2, wy)), F::sum(F::mul(c2, wc)));
  };
  loss().backward();
  for (Tensor* p : {&cell.weight_ih, &cell.weight_hh, &cell.bias_ih, &cell.bias_hh}) {
    const auto analytic = p->grad().to_vector<double>();
    double* v = p->data<double>();
    for (int64_t i = 0; i < p->numel(); ++i) {
      const double keep = v[i], eps = 1e-6;
      v[i] = keep + eps;
      const double up = loss().item<double>();
      v[i] = keep - eps;
      const double down = loss().item<double>();
      v[i] = keep;
      CHECK(analytic[static_cast<size_t>(i)] == Approx((up - down) / (2 * eps)).margin(1e-7));
    }
  }
}

TEST_CASE("LSTM equals stepping its layers' cells, time-major and batch-first", "[lstm]") {
  for (bool batch_first : {false, true}) {
    INFO("batch_first " << batch_first);
    nn::LSTM lstm(3, 4,
                  {.num_layers = 2, .batch_first = batch_first, .dtype = DType::Float64});
    CHECK(lstm.named_parameters().size() == 8);
    CHECK(lstm.named_parameters()[4].first == "weight_ih_l1");
    const int64_t steps = 5, batch = 2;
    const Tensor x = batch_first ? randn({batch, steps, 3}, DType::Float64)
                                 : randn({steps, batch, 3}, DType::Float64);
    const Tensor h0 = randn({2, batch, 4}, DType::Float64), c0 = randn({2, batch, 4},
                                                                        DType::Float64);
    const auto [y, hn, cn] = lstm(x, h0, c0);
    CHECK(y.shape() == (batch_first ? Shape({batch, steps, 4}) : Shape({steps, batch, 4})));
    CHECK(hn.shape() == Shape({2, batch, 4}));
    // The same parameters in two cells, stepped by hand.
    std::vector<double> want_y;
    Tensor input = x;
    for (int layer = 0; layer < 2; ++layer) {
      nn::LSTMCell cell(layer == 0 ? 3 : 4, 4, {.dtype = DType::Float64});
      {
        NoGradGuard no_grad;
        copy_(cell.weight_ih, lstm.weight_ih[layer]);
        copy_(cell.weight_hh, lstm.weight_hh[layer]);
        copy_(cell.bias_ih, lstm.bias_ih[layer]);
        copy_(cell.bias_hh, lstm.bias_hh[layer]);
      }
      Tensor h = F::reshape(F::slice(h0, 0, layer, layer + 1), {batch, 4});
      Tensor c = F::reshape(F::slice(c0, 0, layer, layer + 1), {batch, 4});
      std::vector<Tensor> outs;
      for (int64_t t = 0; t < steps; ++t) {
        const int axis = batch_first ? 1 : 0;
        const Tensor xt =
            F::reshape(F::slice(input, axis, t, t + 1), {batch, input.size(2)});
        std::tie(h, c) = cell(xt, h, c);
        outs.push_back(batch_first ? F::reshape(h, {batch, 1, 4}) : F::reshape(h, {1, batch, 4}));
      }
      input = F::concat(outs, batch_first ? 1 : 0);
      check_close(F::reshape(F::slice(hn, 0, layer, layer + 1), {batch, 4}).to_vector<double>(),
                  h.to_vector<double>(), 1e-12);
      check_close(F::reshape(F::slice(cn, 0, layer, layer + 1), {batch, 4}).to_vector<double>(),
                  c.to_vector<double>(), 1e-12);
    }
    check_close(y.to_vector<double>(), input.to_vector<double>(), 1e-12);
    // No initial state is a zero state.
    const auto [y0, hn0, cn0] = lstm(x);
    const auto [yz, hnz, cnz] = lstm(x, zeros({2, batch, 4}, DType::Float64),
                                     zeros({2, batch, 4}, DType::Float64));
    check_close(y0.to_vector<double>(), yz.to_vector<double>(), 1e-12);
    check_close(cn0.to_vector<double>(), cnz.to_vector<double>(), 1e-12);
  }
}

TEST_CASE("LSTM without a state computes with a zero one: a NaN weight shows, as in PyTorch",
          "[lstm]") {
  for (const double bad : {std::nan(""), static_cast<double>(INFINITY)}) {
    INFO("weight_hh holds " << bad);
    manual_seed(12);
    nn::LSTM lstm(3, 2);
    lstm.weight_hh[0].data<float>()[0] = static_cast<float>(bad);  // row 0: input gate, unit 0
    const Tensor x = randn({1, 1, 3});
    const auto [y, h, c] = lstm(x);
    const auto [yz, hz, cz] = lstm(x, zeros({1, 1, 2}), zeros({1, 1, 2}));
    CHECK(bit_diff(y, yz) == "");
    CHECK(bit_diff(c, cz) == "");
    CHECK(std::isnan(y.to_vector<float>()[0]));
  }
  // LSTMCell with no state, as PyTorch's default: zeros, and a NaN weight_hh shows there too.
  manual_seed(13);
  nn::LSTMCell cell(3, 2);
  const Tensor x = randn({2, 3});
  const auto [h1, c1] = cell(x, Tensor(), Tensor());
  const auto [hz, cz] = cell(x, zeros({2, 2}), zeros({2, 2}));
  CHECK(bit_diff(h1, hz) == "");
  CHECK(bit_diff(c1, cz) == "");
  cell.weight_hh.data<float>()[0] = NAN;
  CHECK(std::isnan(cell(x, Tensor(), Tensor()).first.to_vector<float>()[0]));
  // lstm_state with no cell state: a NaN forget gate shows too.
  const Tensor gates = tensor({0, 0, NAN, 0, 0, 0, 0, 0}, {1, 8});
  CHECK(std::isnan(nn::lstm_state(gates, Tensor()).second.to_vector<float>()[0]));
}

TEST_CASE("LSTM and LSTMCell name the argument and the shapes of bad input", "[lstm][errors]") {
  nn::LSTMCell cell(3, 4);
  CHECK_THAT(error_of([&] { cell(zeros({2, 5}), zeros({2, 4}), zeros({2, 4})); }),
             Contains("LSTMCell: x must be [B,3], it is [2,5]"));
  CHECK_THAT(error_of([&] { cell(zeros({2, 3}), zeros({3, 4}), zeros({2, 4})); }),
             Contains("LSTMCell: h must be [2,4] for x [2,3], it is [3,4]"));
  nn::LSTM lstm(3, 4, {.num_layers = 2});
  CHECK_THAT(error_of([&] { lstm(zeros({5, 2, 4})); }),
             Contains("LSTM: x must be [T,B,3], it is [5,2,4]"));
  CHECK_THAT(error_of([&] { lstm(zeros({5, 2, 3}), zeros({1, 2, 4}), zeros({1, 2, 4})); }),
             Contains("LSTM: h0 must be [2,2,4], it is [1,2,4]"));
  CHECK_THAT(error_of([] { nn::LSTM(0, 4); }), Contains("LSTM: input_size and hidden_size"));
}

TEST_CASE("LSTM and LSTMCell refuse inputs and states of another dtype than their weights",
          "[lstm][errors]") {
  nn::LSTM lstm(3, 4, {.num_layers = 2});
  const Tensor x = randn({5, 2, 3});
  const Tensor s32 = zeros({2, 2, 4}), s64 = zeros({2, 2, 4}, DType::Float64);
  CHECK_THAT(error_of([&] { lstm(x, s64, s64); }),
             Contains("LSTM: h0 must be float32 as the weights, it is float64 [2,2,4]"));
  CHECK_THAT(error_of([&] { lstm(x, s32, s64); }),
             Contains("LSTM: c0 must be float32 as the weights, it is float64 [2,2,4]"));
  CHECK_THAT(error_of([&] {
               lstm(randn({5, 2, 3}, DType::Float64));
             }),
             Contains("LSTM: x must be float32 as the weights, it is float64 [5,2,3]"));
  nn::LSTMCell cell(3, 4);
  const Tensor xc = randn({2, 3}), h32 = zeros({2, 4}), h64 = zeros({2, 4}, DType::Float64);
  CHECK_THAT(error_of([&] { cell(xc, h64, h32); }),
             Contains("LSTMCell: h must be float32 as the weights, it is float64 [2,4]"));
  CHECK_THAT(error_of([&] { cell(xc, h32, h64); }),
             Contains("LSTMCell: c must be float32 as the weights, it is float64 [2,4]"));
  CHECK_THAT(error_of([&] {
               cell(xc, zeros({2, 4}, DType::Int64), h32);
             }),
             Contains("LSTMCell: h must be float32 as the weights, it is int64 [2,4]"));
  nn::LSTMCell cell64(3, 4, {.dtype = DType::Float64});
  CHECK_THAT(error_of([&] { cell64(xc, h64, h64); }),
             Contains("LSTMCell: x must be float64 as the weights, it is float32 [2,3]"));
  CHECK_NOTHROW(cell64(randn({2, 3}, DType::Float64), h64, h64));
}

TEST_CASE("a module whose forward takes three tensors and returns two is static with one line",
          "[lstm][static]") {
  StaticEnabled on;
  for (DType dt : {DType::Float32, DType::Float64}) {
    INFO(std::string(name(dt)));
    nn::LSTMCell eager(5, 6, {.dtype = dt});
    StaticCell traced(5, 6, {.dtype = dt});
    {
      NoGradGuard no_grad;
      for (auto& [name, p] : traced.named_parameters())
        for (auto& [n2, q] : eager.named_parameters())
          if (n2 == name) copy_(p, q);
    }
    const Tensor h0 = randn({3, 6}, dt), c0 = randn({3, 6}, dt);
    for (int call = 0; call < 3; ++call) {
      INFO("call " << call);
      std::vector<Tensor> xs;
      for (int t = 0; t < 4; ++t) xs.push_back(randn({3, 5}, dt));
      Tensor loss_e, loss_s;
      for (int which = 0; which < 2; ++which) {
        Tensor h = h0, c = c0;
        for (const Tensor& x : xs) std::tie(h, c) = which ? traced(x, h, c) : eager(x, h, c);
        (which ? loss_s : loss_e) = F::add(F::sum(h), F::mean(c));
      }
      CHECK(bit_diff(loss_e, loss_s) == "");
      eager.zero_grad();
      traced.zero_grad();
      loss_e.backward();
      loss_s.backward();
      testing::check_same_parameters(eager, traced, "after backward");
    }
    // Two signatures: the given state needs no gradient, the state a step returns does. Each
    // replays from its second call on, once its first backward is recorded.
    const StaticStats st = static_stats(traced);
    CHECK(st.calls == 12);
    CHECK(st.traces == 2);
    CHECK(st.hits + st.eager_calls == 10);
    CHECK(st.hits >= 8);
  }
  // Through a Module pointer, which calls with one tensor: an Error, not a crash.
  StaticCell cell(5, 6);
  nn::Module& m = cell;
  CHECK_THAT(error_of([&] { m(zeros({3, 5})); }), Contains("does not take 1 tensors"));
}
