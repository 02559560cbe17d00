// A CUDA graph's first copies (cuda::GraphCopy, runtime/cuda.h): they run before all of the
// graph's work, on its branches too, from the sources each launch gives (one in memory allocated
// after the capture, the last one's freed). A static replay copies its arguments and incoming
// gradients into its staging buffers so (schedule/cuda_graph.cc): fresh tensors, one rewritten
// in place, an earlier one again and a view at an offset replay eager's bits, all as graph
// launches. Arguments whose addresses repeat are read where they are instead, by graphs keyed by
// those addresses: the same tensors again, two in turn, one rewritten in place.
#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/cuda.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {
constexpr int kDevice = 0;
}  // namespace

TEST_CASE("a CUDA graph's first copies run before its work, from each launch's sources",
          "[cuda][runtime][graphs]") {
  const int64_t n = int64_t{1} << 22;  // 16 MiB: a branch that did not wait would read a part
  const Tensor staged = zeros({n}, DType::Float32, kCuda);
  const Tensor out0 = zeros({n}, DType::Float32, kCuda), out1 = zeros({n}, DType::Float32, kCuda);
  std::vector<Tensor> sources;
  for (int k = 0; k < 3; ++k) sources.push_back(zeros({n}, DType::Float32, kCuda));
  cuda::synchronize(kDevice);
  const cuda::StreamHandle s0 = cuda::capture_stream(kDevice, 0),
                           s1 = cuda::capture_stream(kDevice, 1);
  const auto copy_from = [&](const Tensor& src) {
    return cuda::GraphCopy{staged.raw_data(), src.raw_data(), staged.nbytes()};
  };

  cuda::Graph g;
  {
    const cuda::StreamGuard on(kDevice, s0);
    const cuda::StreamHandle branches[] = {s1};
    g.begin_capture(s0, branches);
    copy_on(s0, out0, staged);  // both read the staging buffer: one on the stream,
    copy_on(s1, out1, staged);  // one on the branch
    const cuda::GraphCopy first[] = {copy_from(sources[0])};
    REQUIRE(g.end_capture(first));
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> value(-1, 1);
  std::vector<float> host(static_cast<size_t>(n));
  // Sources 0, 1, 2, then each again rewritten in place (the same address, new values).
  for (int launch = 0; launch < 6; ++launch) {
    INFO("launch " << launch);
    const Tensor& src = sources[launch % 3];
    for (float& v : host) v = value(rng);
    cuda::copy_bytes(src.raw_data(), kCuda, host.data(), Device::cpu(), src.nbytes());
    const cuda::GraphCopy copies[] = {copy_from(src)};
    REQUIRE(g.launch(cuda::current_stream(kDevice), copies));
    cuda::synchronize(kDevice);
    CHECK(bit_diff(staged, src) == "");
    CHECK(bit_diff(out0, src) == "");
    CHECK(bit_diff(out1, src) == "");
  }
  // A source in new memory, the last one's freed (cudaFree) before the launch.
  const Tensor fresh = full({n}, 0.5, DType::Float32, kCuda);
  sources.clear();
  allocator_for(kCuda).empty_cache();
  const cuda::GraphCopy copies[] = {copy_from(fresh)};
  REQUIRE(g.launch(cuda::current_stream(kDevice), copies));
  cuda::synchronize(kDevice);
  CHECK(bit_diff(out0, fresh) == "");
  CHECK(bit_diff(out1, fresh) == "");
  // A launch must give the graph's copies.
  CHECK_THROWS_AS(g.launch(cuda::current_stream(kDevice)), Error);
}

TEST_CASE("a static replay's CUDA graphs copy each call's arguments and incoming gradients",
          "[cuda][static][graphs]") {
  GraphsEnabled use_graphs(true);
  GraphDirectArguments staged_only(false);
  StaticEnabled on;
  const auto values = [](const Shape& shape) {
    return rand(shape, DType::Float32, Device::cpu(), -1, 1).to(kCuda);
  };
  Tensor w = values({6, 5}).set_requires_grad();
  auto body = [&](const Tensor& x) { return F::matmul(x, w); };
  auto f = static_graph(body, {.name = "staged_arguments"});
  // Kept alive, so that each fresh argument has an address of its own.
  std::vector<Tensor> xs;
  const Tensor rows = values({5, 6});
  constexpr int kCalls = 8;
  for (int call = 0; call < kCalls; ++call) {
    INFO("call " << call);
    Tensor x;
    if (call <= 2 || call == 7) {  // fresh
      x = xs.emplace_back(values({4, 6}));
    } else if (call == 3) {  // the last one, rewritten in place
      x = xs.back();
      copy_(x, values({4, 6}));
    } else if (call == 4) {  // the first one again
      x = xs.front();
    } else {  // a view of rows 1 to 4 (24 bytes past its storage's start), then rewritten in place
      x = Tensor(make_intrusive<TensorImpl>(rows.impl()->storage, rows.impl()->offset + 6,
                                            Shape{4, 6}, DType::Float32));
      if (call == 6) copy_(rows, values({5, 6}));
    }
    const Tensor gy = values({4, 5});
    w.set_grad(Tensor());
    const Tensor ys = f(x);
    ys.backward(gy);
    const Tensor static_grad = on_host(w.grad());
    w.set_grad(Tensor());
    const Tensor ye = body(x);
    ye.backward(gy);
    CHECK(bit_diff(ys, ye) == "");
    CHECK(bit_diff(static_grad, on_host(w.grad())) == "");
  }
  const StaticStats stats = f.stats();
  REQUIRE(stats.cache.size() == 1);
  const EntryReport& e = stats.cache[0];
  INFO(e.graph_text());
  CHECK(stats.hits == kCalls - 1);
  CHECK(e.stream_replays == 0);
  CHECK(e.graph_capture_failures == 0);
  CHECK(e.graph_launches == 2 * (kCalls - 1));  // a forward and a backward per replay
  // Per phase, one graph for the arguments on 256 bytes and one for the rows at 24: the staged
  // copies sit at the caller's alignment, which the graphs' keys hold.
  CHECK(e.graph_captures == 4);
}

namespace {
// y = x w, and in a training form the gradients of w from gy, as a static function on cuda:0
// and eagerly, side by side: each call's output (and w's gradient) equal.
class Product {
 public:
  explicit Product(bool backward)
      : backward_(backward),
        w_(rand({6, 5}, DType::Float32, Device::cpu(), -1, 1).to(kCuda)),
        gy_(rand({4, 5}, DType::Float32, Device::cpu(), -1, 1).to(kCuda)),
        f_([this](const Tensor& x) { return F::matmul(x, w_); },
           {.name = backward ? "direct_arguments_backward" : "direct_arguments"}) {
    if (backward_) w_.set_requires_grad();
  }
  void call(const Tensor& x, const std::string& what) {
    INFO(what);
    std::optional<NoGradGuard> no_grad;
    if (!backward_) no_grad.emplace();
    w_.set_grad(Tensor());
    const Tensor ys = f_(x);
    if (backward_) ys.backward(gy_);
    const Tensor static_grad = backward_ ? on_host(w_.grad()) : Tensor();
    w_.set_grad(Tensor());
    const Tensor ye = F::matmul(x, w_);
    CHECK(bit_diff(ys, ye) == "");
    if (backward_) {
      ye.backward(gy_);
      CHECK(bit_diff(static_grad, on_host(w_.grad())) == "");
    }
  }
  EntryReport report() const {
    const StaticStats s = f_.stats();
    REQUIRE(s.cache.size() == 1);
    return s.cache[0];
  }

 private:
  bool backward_;
  Tensor w_, gy_;
  StaticFunction<std::function<Tensor(const Tensor&)>> f_;
};
}  // namespace

TEST_CASE("a static replay's CUDA graphs read arguments whose addresses repeat where they are",
          "[cuda][static][graphs]") {
  GraphsEnabled use_graphs(true);
  GraphDirectArguments direct(true);
  StaticEnabled on;
  const bool backward = GENERATE(false, true);
  INFO((backward ? "forward and backward" : "forward only"));
  Product f(backward);
  const auto values = [] { return rand({4, 6}, DType::Float32, Device::cpu(), -1, 1).to(kCuda); };
  const Tensor x0 = values(), x1 = values();
  f.call(x0, "trace");
  f.call(x0, "x0: copied (its addresses are new to the arena)");
  f.call(x0, "x0 again: read where it is, by a graph of its own");
  f.call(x0, "x0 a third time: that graph again");
  f.call(x1, "x1: copied, by the first graph");
  f.call(x0, "x0: its graph");
  f.call(x1, "x1 again: a graph of its own");
  f.call(x1, "x1 a third time: its graph");
  copy_(x0, values());
  f.call(x0, "x0 rewritten in place: its graph, which reads the new values");
  // Fresh tensors (kept alive, so that each has an address of its own) are copied, by the first
  // graph: no capture.
  std::vector<Tensor> fresh;
  for (int k = 0; k < 2; ++k) f.call(fresh.emplace_back(values()), "a fresh tensor");
  const EntryReport e = f.report();
  INFO(e.graph_text());
  CHECK(e.stream_replays == 0);
  CHECK(e.graph_capture_failures == 0);
  if (!backward) {
    CHECK(e.graph_launches == 10);
    CHECK(e.graph_direct_launches == 6);  // x0 four times, x1 twice
    CHECK(e.graph_captures == 3);         // the copying graph, x0's and x1's
    CHECK_THAT(e.graph_text(), Catch::Matchers::Contains("6 reading the arguments where they are"));
  } else {
    // The backward reads x and gy: its direct graphs follow the forward's (gy is one tensor).
    CHECK(e.graph_launches == 20);
    CHECK(e.graph_direct_launches == 12);
    CHECK(e.graph_captures == 6);
  }
}

TEST_CASE("with direct arguments off, a static replay's CUDA graphs copy repeated arguments",
          "[cuda][static][graphs]") {
  GraphsEnabled use_graphs(true);
  GraphDirectArguments staged_only(false);
  StaticEnabled on;
  Product f(/*backward=*/false);
  const Tensor x = rand({4, 6}, DType::Float32, Device::cpu(), -1, 1).to(kCuda);
  for (int call = 0; call < 4; ++call) f.call(x, cat("call ", call));
  const EntryReport e = f.report();
  INFO(e.graph_text());
  CHECK(e.graph_launches == 3);
  CHECK(e.graph_direct_launches == 0);
  CHECK(e.graph_captures == 1);
}
