// Dynamic shapes over random programs: a flat program over [B, 6] (elementwise ops, linear and
// matmul, reductions over either axis, softmax, layer norm, concat and chunk along the batch,
// reshapes, slices, dropout) and an image program over [B, 2, H, W] (convolution, pooling, batch
// norm, means), each called at 20 random sizes: results, the input's gradient and the
// parameters' gradients equal eager bit for bit, and one family serves them after a few traces.
#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "tests/test_util.h"

namespace encore::testing {
namespace {

// A random program over h [B, kFeatures] (or an image program over [B, 2, H, W], then pooled
// to [B, 2]), its parameters made from a seed; two programs of one seed are equal.
constexpr int64_t kFeatures = 6;
constexpr int kFlatOps = 17;

struct DynProgram {
  std::vector<int> ops;
  bool image = false;
  std::vector<int> image_ops;
  Tensor w, b, g, cw, cb, rm, rv;
};

DynProgram make_program(uint64_t seed, bool image) {
  std::mt19937_64 rng(seed);
  DynProgram p;
  p.image = image;
  const int n = 3 + static_cast<int>(rng() % 6);
  for (int i = 0; i < n; ++i) p.ops.push_back(static_cast<int>(rng() % kFlatOps));
  if (image) {
    const int m = 2 + static_cast<int>(rng() % 4);
    for (int i = 0; i < m; ++i) p.image_ops.push_back(static_cast<int>(rng() % 6));
  }
  manual_seed(seed);
  auto param = [](Shape s, double scale) {
    Tensor t = randn(s) * scale;
    t = t.detach();
    t.set_requires_grad(true);
    return t;
  };
  p.w = param({kFeatures, kFeatures}, 0.4);
  p.b = param({kFeatures}, 0.1);
  p.g = param({kFeatures}, 0.2) + 1.0;
  p.g = p.g.detach();
  p.g.set_requires_grad(true);
  p.cw = param({2, 2, 3, 3}, 0.3);
  p.cb = param({2}, 0.1);
  p.rm = zeros({2});
  p.rv = ones({2});
  return p;
}

Tensor run_flat(const DynProgram& p, Tensor h) {
  for (int op : p.ops) {
    switch (op) {
      case 0:
        h = F::relu(h);
        break;
      case 1:
        h = F::tanh(h) + h * 0.5;
        break;
      case 2:
        h = F::linear(h, p.w, p.b);
        break;
      case 3:
        h = h + p.b;
        break;
      case 4:
        h = F::layer_norm(h, {kFeatures}, p.g, p.b);
        break;
      case 5:
        h = F::softmax(h, -1);
        break;
      case 6:
        h = h - F::mean(h, {1}, true);
        break;
      case 7:
        h = h * F::sigmoid(F::sum(h, {0}, true));
        break;   // over the batch
      case 8: {  // the batch doubled, then halved again
        const std::vector<Tensor> parts = F::chunk(F::concat({h, h * 2.0}, 0), 2, 0);
        h = parts[0] + parts[1];
        break;
      }
      case 9:
        h = F::reshape(F::reshape(h, {-1}), {-1, kFeatures});
        break;
      case 10:
        h = F::max(h, {1}, true) * h;
        break;
      case 11:
        h = F::concat({F::slice(h, 1, 1, kFeatures), F::slice(h, 1, 0, 1)}, 1);
        break;
      case 12:
        h = F::matmul(h, p.w);
        break;
      case 13:
        h = h - F::mean(h, {0}, true);
        break;  // its gradient divides by the batch
      case 14:
        h = F::log_softmax(h, -1);
        break;
      case 15:
        h = F::dropout(h, 0.25);
        break;
      default:
        h = h + F::matmul(h, F::matmul(F::transpose(h, 0, 1), h)) * 0.01;
        break;
    }
  }
  return h;
}

Tensor run_program(const DynProgram& p, const Tensor& x) {
  if (!p.image) return run_flat(p, x);
  Tensor h = x;
  int pools = 0;
  for (int op : p.image_ops) {
    switch (op) {
      case 0:
        h = F::relu(F::conv2d(h, p.cw, p.cb, 1, 1));
        break;
      case 1:
        if (pools++ < 2) h = F::max_pool2d(h, 2);
        break;
      case 2:
        h = F::batch_norm(h, p.rm, p.rv, Tensor(), Tensor(), true);
        break;
      case 3:
        h = h - F::mean(h, {2, 3}, true);
        break;
      case 4:
        if (pools++ < 2) h = F::avg_pool2d(h, 2);
        break;
      default:
        h = F::tanh(h) * 1.5;
        break;
    }
  }
  // [B, 2, h, w] -> [B, 2] -> [B, kFeatures], then the flat program.
  h = F::global_avg_pool2d(h);
  return run_flat(p, F::concat({h, h * 0.5, h * 2.0}, 1));
}

// Calls a random program's static form at 20 random sizes and compares it with eager: results,
// the input's gradient and the parameters' gradients bit for bit.
void check_dynamic_program(uint64_t seed, bool image) {
  StaticEnabled on;
  DynProgram pe = make_program(seed, image), ps = make_program(seed, image);
  auto fn = static_graph([&](const Tensor& x) { return run_program(ps, x); },
                         {.name = "dyn_program", .arg_names = {"x"}});
  std::mt19937_64 rng(seed * 31 + 7);
  std::set<std::string> shapes;
  for (int call = 0; call < 20; ++call) {
    const int64_t batch = 2 + static_cast<int64_t>(rng() % 9);
    const int64_t h = 8 + static_cast<int64_t>(rng() % 17),
                  w = 8 + static_cast<int64_t>(rng() % 17);
    manual_seed(seed + 1000 + static_cast<uint64_t>(call));
    const Tensor x0 = image ? randn({batch, 2, h, w}) : randn({batch, kFeatures});
    shapes.insert(x0.shape().str());
    INFO("program " << seed << (image ? " (image)" : "") << ", call " << call << ", x "
                    << x0.shape().str());
    Tensor xe = x0.detach(), xs = x0.detach();
    xe.set_requires_grad(true);
    xs.set_requires_grad(true);
    manual_seed(77 + static_cast<uint64_t>(call));
    const Tensor ye = run_program(pe, xe);
    manual_seed(77 + static_cast<uint64_t>(call));
    const Tensor ys = fn(xs);
    REQUIRE(bit_diff(ye, ys) == "");
    F::sum(ye * ye).backward();
    F::sum(ys * ys).backward();
    CHECK(bit_diff(xe.grad(), xs.grad()) == "");
    for (auto [a, b] : {std::pair{pe.w, ps.w}, std::pair{pe.b, ps.b}, std::pair{pe.g, ps.g},
                        std::pair{pe.cw, ps.cw}, std::pair{pe.cb, ps.cb}})
      CHECK(bit_diff(a.grad(), b.grad()) == "");
    CHECK(bit_diff(pe.rm, ps.rm) == "");
    CHECK(bit_diff(pe.rv, ps.rv) == "");
  }
  const StaticStats st = fn.stats();
  INFO("program " << seed << (image ? " (image)" : "") << "\n" << joined(st.warnings));
  CHECK(st.static_dims.empty());
  CHECK(st.dynamic_events >= 1);
  // Two traces, and one more wherever the traces so far did not tell two sizes apart (pooled
  // sizes of small images often agree at two sizes); every other call replays.
  CHECK(st.traces <= (image ? 4 : 3));
  CHECK(st.traces + st.hits == 20);
  // Each size traced or planned once (more than size_limit sizes may be planned again).
  CHECK(st.traces + st.sizes_planned >= static_cast<int64_t>(shapes.size()));
  if (shapes.size() <= 16)
    CHECK(st.traces + st.sizes_planned == static_cast<int64_t>(shapes.size()));
}

TEST_CASE("dynamic: random programs equal eager at 20 random batch sizes", "[static][dynamic]") {
  for (uint64_t seed = 1; seed <= 16; ++seed) check_dynamic_program(seed, false);
}

TEST_CASE("dynamic: random image programs at 20 random batch, height and width sizes",
          "[static][dynamic]") {
  for (uint64_t seed = 101; seed <= 108; ++seed) check_dynamic_program(seed, true);
}

}  // namespace
}  // namespace encore::testing
