// The runtime on cuda:0: copies between devices for every dtype and shape, to()'s gradients, the
// caching allocator's statistics and record_stream, products and convolutions on several streams,
// pinned host memory and asynchronous copies, errors for mixed devices and errors kernels report
// (bad labels and ids), item(), factories on the device, Module::to and pinned batches.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "encore/encore.h"
#include "encore/static_graph.h"
#include "runtime/allocator.h"
#include "runtime/cuda.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;
using Catch::Matchers::Contains;

namespace {

// A cpu tensor of `shape` whose element i is a distinct value of `dtype` (bool: alternating).
Tensor pattern(const Shape& shape, DType dtype, int64_t salt = 0) {
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i + salt;
    switch (dtype) {
      case DType::Float32:
        t.data<float>()[i] = static_cast<float>(k) * 0.25f - 1000.5f;
        break;
      case DType::Float64:
        t.data<double>()[i] = static_cast<double>(k) * 1e-3 - 7.0 / 3.0;
        break;
      case DType::Int32:
        t.data<int32_t>()[i] = static_cast<int32_t>(k * 7919 % 2000003) - 1000000;
        break;
      case DType::Int64:
        t.data<int64_t>()[i] = (k - 5) * (int64_t{1} << 40) + k;
        break;
      case DType::Bool:
        t.data<bool>()[i] = (k * 7) % 3 == 1;
        break;
    }
  }
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

AllocatorStats cuda_stats() {
  cuda::synchronize();
  return allocator_for(kCuda).stats();
}

}  // namespace

// ---- Copies --------------------------------------------------------------------------------

TEST_CASE("to() copies every dtype and shape to cuda and back", "[cuda][runtime]") {
  const std::vector<Shape> shapes = {Shape{},        Shape{0},       Shape{1},
                                     Shape{7},       Shape{2, 3},    Shape{0, 5},
                                     Shape{3, 0, 2}, Shape{4, 1, 3}, Shape{1000003}};
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Bool})
    for (const Shape& shape : shapes) {
      INFO(name(dt) << " " << shape.str());
      const Tensor host = pattern(shape, dt);
      const Tensor dev = host.to(kCuda);
      CHECK(dev.device() == kCuda);
      CHECK(dev.shape() == shape);
      CHECK(dev.dtype() == dt);
      CHECK(dev.numel() == host.numel());
      CHECK_FALSE(dev.requires_grad());
      CHECK(dev.to(kCuda).is_same(dev));  // already there: the tensor itself
      const Tensor back = dev.to(Device::cpu());
      CHECK(back.device() == Device::cpu());
      CHECK(same_bytes(back, host));
      CHECK(same_bytes(on_host(dev), host));
      // A device-to-device copy (through clone, an op) and a copy of a non-blocking copy.
      if (dt == DType::Float32 || dt == DType::Float64)
        CHECK(same_bytes(on_host(clone(dev)), host));
      const Tensor again = back.to(kCuda, /*non_blocking=*/true).to(Device::cpu(), true);
      cuda::synchronize();
      CHECK(same_bytes(again, host));
    }
}

TEST_CASE("item() and to_vector() read cuda tensors", "[cuda][runtime]") {
  const Tensor x = pattern({5, 7}, DType::Float64).to(kCuda);
  const std::vector<double> want = pattern({5, 7}, DType::Float64).to_vector<double>();
  CHECK(x.to_vector<double>() == want);
  double sum = 0;
  for (double v : want) sum += v;
  CHECK(F::sum(x).item<double>() == Approx(sum).epsilon(1e-13));
  CHECK(F::max(x).item<double>() == want.back());
  CHECK(full({}, 42, DType::Int64, kCuda).item<int64_t>() == 42);
  CHECK(full({1, 1}, -3, DType::Int32, kCuda).item<int32_t>() == -3);
  CHECK(full({1}, 2.5, DType::Float32, kCuda).item<float>() == 2.5f);
  CHECK(pattern({3}, DType::Int64).to(kCuda).to_vector<int64_t>() ==
        pattern({3}, DType::Int64).to_vector<int64_t>());
  CHECK_THROWS_WITH(x.item<double>(), Contains("item") && Contains("[5,7]"));
}

TEST_CASE("factories make tensors on cuda", "[cuda][runtime]") {
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64}) {
    INFO(name(dt));
    const Tensor z = zeros({3, 4}, dt, kCuda), o = ones({5}, dt, kCuda);
    const Tensor f = full({2, 2}, 7, dt, kCuda);
    CHECK(z.device() == kCuda);
    CHECK(z.dtype() == dt);
    CHECK(z.to_vector<double>() == std::vector<double>(12, 0.0));
    CHECK(o.to_vector<double>() == std::vector<double>(5, 1.0));
    CHECK(f.to_vector<double>() == std::vector<double>(4, 7.0));
    CHECK(zeros_like(f).device() == kCuda);
    CHECK(full_like(f, 3).to_vector<double>() == std::vector<double>(4, 3.0));
    CHECK(empty({0, 3}, dt, kCuda).numel() == 0);
  }
  const Tensor r = rand({1000}, DType::Float32, kCuda, 2, 3);
  CHECK(r.device() == kCuda);
  for (float v : r.to_vector<float>()) {
    CHECK(v >= 2.0f);
    CHECK(v <= 3.0f);  // 2 + (1 - 2^-24) rounds to 3 in float32, on the cpu too
  }
  CHECK(randn({10}, DType::Float64, kCuda).device() == kCuda);
}

// ---- Autograd across devices ---------------------------------------------------------------

TEST_CASE("to() is differentiable: the gradient goes back to the source device",
          "[cuda][runtime]") {
  // A cpu leaf used on the GPU: its .grad arrives on the cpu.
  Tensor w = rand({3, 2}).set_requires_grad();
  const Tensor wd = w.to(kCuda);
  CHECK(wd.requires_grad());
  CHECK_FALSE(wd.is_leaf());
  F::sum(F::mul(wd, wd)).backward();
  REQUIRE(w.grad().defined());
  CHECK(w.grad().device() == Device::cpu());
  const std::vector<float> wv = w.to_vector<float>(), gv = w.grad().to_vector<float>();
  for (size_t i = 0; i < wv.size(); ++i) CHECK(gv[i] == 2 * wv[i]);

  // A GPU result moved to the cpu, with a loss there: the gradient reaches the cuda leaf, through
  // the ops before the copy.
  Tensor v = rand({4}, DType::Float64).to(kCuda).set_requires_grad();
  const Tensor y = F::mul(v, 3.0).to(Device::cpu());
  CHECK(y.device() == Device::cpu());
  F::sum(F::mul(y, y)).backward();
  REQUIRE(v.grad().defined());
  CHECK(v.grad().device() == kCuda);
  const std::vector<double> vv = v.to_vector<double>(), g = v.grad().to_vector<double>();
  // d/dv of sum((3v)^2), computed as the ops round it: 3 * (2 * (3 * v)).
  for (size_t i = 0; i < vv.size(); ++i) CHECK(g[i] == 3.0 * (2.0 * (3.0 * vv[i])));

  // Two copies there and back: the gradients of both paths add up on the source.
  Tensor u = rand({5}).set_requires_grad();
  F::sum(F::add(u.to(kCuda), u.to(kCuda)).to(Device::cpu())).backward();
  for (float gi : u.grad().to_vector<float>()) CHECK(gi == 2.0f);

  // Nothing is recorded without grad mode, or for a tensor that needs no gradient.
  {
    NoGradGuard off;
    CHECK_FALSE(w.to(kCuda).requires_grad());
  }
  CHECK_FALSE(rand({2}).to(kCuda).requires_grad());
}

// ---- Streams and memory ----------------------------------------------------------------------

namespace {
// `rows` int64 labels on cuda, (i * 31 + 7) % classes for sample i.
Tensor spread_labels(int64_t rows, int64_t classes) {
  std::vector<double> ids(rows);
  for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<double>((i * 31 + 7) % classes);
  return tensor(ids, {rows}, DType::Int64, kCuda);
}

// A host function that holds its stream until `*go` is set.
void hold_stream(void* go) {
  while (!static_cast<std::atomic<bool>*>(go)->load()) {
  }
}
}  // namespace

TEST_CASE("a block recorded on another stream is reused only once that stream has passed it",
          "[cuda][runtime]") {
  const cuda::StreamHandle side = cuda::create_stream(0);
  for (bool record : {false, true}) {
    INFO((record ? "recorded" : "not recorded"));
    std::atomic<bool> go{false};
    Tensor x = rand({4096}).to(kCuda);
    cuda::synchronize(0);
    const void* block = x.raw_data();
    Tensor y;
    {
      cuda::StreamGuard on_side(0, side);
      cuda::call_after_stream(0, &hold_stream, &go);  // the side stream waits for `go`
      y = F::mul(x, 2.0);                             // queued behind it: reads x later
      if (record) x.record_stream(side);
    }
    x = Tensor();  // freed on the host while the side stream still has to read it
    const Tensor z = empty({4096}, DType::Float32, kCuda);
    // Unrecorded, the allocator hands the block out at once (the race record_stream prevents).
    CHECK((z.raw_data() == block) == !record);
    CHECK(cuda::pending_frees() == (record ? 1 : 0));
    go = true;
    {
      cuda::StreamGuard on_side(0, side);
      cuda::synchronize(0);
    }
    const Tensor w = empty({4096}, DType::Float32, kCuda);  // takes back what the stream passed
    CHECK(cuda::pending_frees() == 0);
    if (record) CHECK(w.raw_data() == block);
  }
  cuda::destroy_stream(side);
  CHECK_THROWS_WITH(rand({2}).record_stream(side), Contains("record_stream") && Contains("cpu"));
}

TEST_CASE("a block recorded on a stream the user is capturing is given up when freed, and counted",
          "[cuda][runtime][graphs]") {
  // The user's own capture, which the runtime neither began nor can wait for: no event can be
  // recorded on the stream, so the block must never be handed out again.
  const cuda::StreamHandle side = cuda::create_stream(0);
  const int64_t n = int64_t{1} << 18;
  Tensor t = zeros({n}, DType::Float32, kCuda);
  cuda::synchronize(0);
  const void* block = t.raw_data();
  t.record_stream(side);
  const auto stream = static_cast<cudaStream_t>(side);
  REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed) == cudaSuccess);
  const cuda::LostFrees before = cuda::lost_frees();
  const int64_t pending = cuda::pending_frees();
  t = Tensor();
  const cuda::LostFrees after = cuda::lost_frees();
  const Tensor u = zeros({n}, DType::Float32, kCuda);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  if (graph != nullptr) (void)cudaGraphDestroy(graph);
  CHECK(after.blocks == before.blocks + 1);
  CHECK(after.bytes == before.bytes + n * 4);
  CHECK(cuda::pending_frees() == pending);
  CHECK(u.raw_data() != block);
  cuda::synchronize(0);
  const Tensor w = zeros({n}, DType::Float32, kCuda);  // nor after the capture
  CHECK(w.raw_data() != block);
  cuda::destroy_stream(side);
}

TEST_CASE("a static call on another stream than its arena's last call waits for that call",
          "[cuda][runtime][static]") {
  with_graphs_on_and_off([](bool) {
    StaticEnabled on;
    auto f = static_graph([](const Tensor& x) { return F::mul(F::add(x, 1.0), 2.0); },
                          {.name = "two_streams"});
    const Tensor x1 = rand({1024}).to(kCuda), x2 = rand({1024}).to(kCuda);
    const Tensor expected1 = f(x1), expected2 = f(x2);  // the trace, and a replay (the capture)
    cuda::synchronize(0);
    const cuda::StreamHandle a = cuda::create_stream(0), b = cuda::create_stream(0);
    std::atomic<bool> go{false};
    Tensor y1, y2;
    {
      cuda::StreamGuard on_a(0, a);
      cuda::call_after_stream(0, &hold_stream, &go);  // stream a waits for `go`
      y1 = f(x1);  // queued behind it; the call's arena is free again on the host
    }
    {
      cuda::StreamGuard on_b(0, b);
      y2 = f(x2);  // the same arena: stream b must wait for stream a's replay
      // Unordered, stream b's few small kernels would be long done.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      CHECK_FALSE(cuda::stream_finished(0));
    }
    go = true;
    for (const cuda::StreamHandle s : {a, b}) {
      cuda::StreamGuard on(0, s);
      cuda::synchronize(0);
    }
    CHECK(bit_diff(y1, expected1) == "");
    CHECK(bit_diff(y2, expected2) == "");
    CHECK(f.stats().cache.at(0).arenas == 1);
    cuda::destroy_stream(a);
    cuda::destroy_stream(b);
  });
}

TEST_CASE("products and convolutions on several streams equal the default stream's",
          "[cuda][runtime]") {
  const Tensor a = rand({64, 96}), b = rand({96, 48});
  const Tensor x = rand({2, 3, 9, 9}), w = rand({4, 3, 3, 3});
  const Tensor ad = a.to(kCuda), bd = b.to(kCuda), xd = x.to(kCuda), wd = w.to(kCuda);
  const std::vector<float> mm = F::matmul(ad, bd).to_vector<float>();
  const std::vector<float> conv = F::conv2d(xd, wd).to_vector<float>();
  // Each stream has its own handles and workspaces; a destroyed stream's handle may come back
  // for a new stream, whose handles are then made anew.
  for (int round = 0; round < 3; ++round) {
    const cuda::StreamHandle s1 = cuda::create_stream(0), s2 = cuda::create_stream(0);
    Tensor m1, m2, c1, c2;
    {
      cuda::StreamGuard on(0, s1);
      m1 = F::matmul(ad, bd);
      c1 = F::conv2d(xd, wd);
    }
    {
      cuda::StreamGuard on(0, s2);
      m2 = F::matmul(ad, bd);
      c2 = F::conv2d(xd, wd);
    }
    for (cuda::StreamHandle s : {s1, s2}) {
      cuda::StreamGuard on(0, s);
      cuda::synchronize(0);
    }
    for (const Tensor* m : {&m1, &m2}) CHECK(m->to_vector<float>() == mm);
    for (const Tensor* c : {&c1, &c2}) CHECK(c->to_vector<float>() == conv);
    cuda::destroy_stream(s1);
    cuda::destroy_stream(s2);
  }
}

// ---- Errors found on the device ---------------------------------------------------------------

TEST_CASE("an out-of-range label or id on cuda raises the cpu's Error when the host next waits",
          "[cuda][runtime]") {
  const Tensor logits = rand({4, 5}).to(kCuda);
  const Tensor bad_labels = tensor({1, 7, 2, 0}, {4}, DType::Int64, kCuda);
  // The kernel cannot throw: the op returns, and the report waits for the next wait.
  const Tensor loss = F::softmax_cross_entropy(logits, bad_labels);
  CHECK_THROWS_WITH(loss.item<float>(),
                    Contains("softmax_cross_entropy: label 7 of sample 1 is out of range [0, 5)") &&
                        Contains("cuda:0"));
  // Reported once: the next wait is clean, and a good call gives a number.
  CHECK_NOTHROW(cuda::synchronize());
  const Tensor good = tensor({1, 3, 2, 0}, {4}, DType::Int64, kCuda);
  CHECK(std::isfinite(F::softmax_cross_entropy(logits, good).item<float>()));
  // cross_entropy names itself and its targets, as on the cpu.
  CHECK_THROWS_WITH(F::cross_entropy(logits, bad_labels).item<float>(),
                    Contains("cross_entropy: argument 'targets': label 7 at flat index 1 is out of "
                             "range [0, 5)"));

  // The gradient's kernel reports too (its own op), as the cpu's does.
  const Tensor gy = tensor({1}, {}, DType::Float32, kCuda);
  const Tensor gx = empty({4, 5}, DType::Float32, kCuda);
  dispatch(Op::SoftmaxCrossEntropyGrad, {logits, bad_labels, gy}, {gx},
           AttrBlob::of(CrossEntropyAttrs{}));
  CHECK_THROWS_WITH(cuda::synchronize(),
                    Contains("softmax_cross_entropy_grad: label 7 of sample 1"));

  // Embedding ids, forward and backward, at a blocking copy to the host.
  const Tensor w = rand({5, 3}).to(kCuda).set_requires_grad();
  const Tensor ids = tensor({0, 9, 4}, {3}, DType::Int32, kCuda);
  const Tensor y = F::embedding(ids, w);
  CHECK_THROWS_WITH(y.to(Device::cpu()),
                    Contains("embedding: argument 'ids' holds 9 at flat index 1, outside [0, 5)"));
  F::sum(y).backward();
  CHECK_THROWS_WITH(w.grad().to_vector<float>(),
                    Contains("embedding_grad: argument 'ids' holds 9 at flat index 1"));
  CHECK_NOTHROW(cuda::synchronize());
}

TEST_CASE("a bad label in a replayed static step on cuda raises the Error at the next wait",
          "[cuda][runtime][static]") {
  with_graphs_on_and_off([](bool) {
    StaticEnabled on;
    const Tensor logits = rand({6, 3}).to(kCuda);
    auto loss_of = static_graph(
        [](const Tensor& x, const Tensor& t) { return F::softmax_cross_entropy(F::relu(x), t); },
        {.name = "loss"});
    const Tensor good = tensor({0, 1, 2, 0, 1, 2}, {6}, DType::Int64, kCuda);
    for (int call = 0; call < 3; ++call) CHECK(std::isfinite(loss_of(logits, good).item<float>()));
    const Tensor bad = tensor({0, 1, 2, -4, 1, 2}, {6}, DType::Int64, kCuda);
    CHECK_THROWS_WITH(loss_of(logits, bad).item<float>(),
                      Contains("label -4 of sample 3 is out of range [0, 3)"));
    CHECK(std::isfinite(loss_of(logits, good).item<float>()));
    CHECK(loss_of.stats().traces == 1);
  });
}

TEST_CASE("a cross-entropy loss over many blocks replays with eager's bits, call after call",
          "[cuda][runtime][static][cross_entropy]") {
  // 1,000 rows: the loss's blocks join their sums in their stream's scratch, which each launch
  // sets up anew (a replayed graph, a stream replay, eager calls).
  const int64_t rows = 1000, classes = 96;
  const Tensor labels = spread_labels(rows, classes);
  with_graphs_on_and_off([&](bool) {
    StaticEnabled on;
    auto loss_of = static_graph(
        [](const Tensor& x, const Tensor& t) { return F::softmax_cross_entropy(x, t); },
        {.name = "wide_loss"});
    manual_seed(41);
    for (int call = 0; call < 4; ++call) {
      INFO("call " << call);
      const Tensor x = randn({rows, classes});
      const Tensor logits = x.to(kCuda);
      const float eager = F::softmax_cross_entropy(logits, labels).item<float>();
      const float replayed = loss_of(logits, labels).item<float>();
      CHECK(replayed == eager);
      const float cpu = F::softmax_cross_entropy(x, labels.to(Device::cpu())).item<float>();
      CHECK(std::abs(eager - cpu) <= 1e-5f * std::abs(cpu));
    }
    CHECK(loss_of.stats().traces == 1);
  });
}

TEST_CASE("cross-entropy losses over many blocks on two threads and streams at once",
          "[cuda][runtime][cross_entropy]") {
  // Each (thread, stream) has its own scratch: the losses neither wait for nor disturb each other.
  const int64_t rows = 1000, classes = 96;
  const Tensor labels = spread_labels(rows, classes);
  manual_seed(43);
  const Tensor logits[2] = {randn({rows, classes}).to(kCuda), randn({rows, classes}).to(kCuda)};
  const float want[2] = {F::softmax_cross_entropy(logits[0], labels).item<float>(),
                         F::softmax_cross_entropy(logits[1], labels).item<float>()};
  int wrong[2] = {0, 0};
  auto work = [&](int k) {
    cuda::set_device(0);
    const cuda::StreamHandle s = cuda::create_stream(0);
    {
      cuda::StreamGuard on(0, s);
      for (int i = 0; i < 200; ++i) {
        const Tensor loss = F::softmax_cross_entropy(logits[k], labels);
        if (i % 50 == 49 && loss.item<float>() != want[k]) ++wrong[k];
      }
      cuda::synchronize(0);
    }
    cuda::destroy_stream(s);
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  CHECK(wrong[0] == 0);
  CHECK(wrong[1] == 0);
}

TEST_CASE("a verified replay on cuda that fails in the middle leaves the next call right",
          "[cuda][runtime][static]") {
  StaticEnabled on;
  const Tensor logits = rand({6, 3}).to(kCuda);
  auto body = [](const Tensor& x, const Tensor& t) {
    return F::softmax_cross_entropy(F::relu(x), t);
  };
  auto loss_of = static_graph(body, {.name = "verified_loss", .verify_every = 1});
  const Tensor good = tensor({0, 1, 2, 0, 1, 2}, {6}, DType::Int64, kCuda);
  const float want = body(logits, good).item<float>();
  // Every loss is kept: past the arena's pool of output storages (4) a replay writes a fixed
  // buffer and copies it into the output's own storage after its last step. The failing call
  // (its eager check raises) leaves the kept losses and the next calls' right.
  std::vector<Tensor> kept;
  for (int call = 0; call < 6; ++call) {
    kept.push_back(loss_of(logits, good));
    CHECK(kept.back().item<float>() == want);
  }
  // Verify mode copies each step's values to the host, where the report is raised: the call
  // stops between its steps, and its block must be released whole.
  const Tensor bad = tensor({0, 1, 2, -4, 1, 2}, {6}, DType::Int64, kCuda);
  CHECK_THROWS_WITH(loss_of(logits, bad), Contains("label -4 of sample 3 is out of range [0, 3)"));
  CHECK_NOTHROW(cuda::synchronize());
  for (int call = 0; call < 2; ++call) {
    kept.push_back(loss_of(logits, good));
    CHECK(kept.back().item<float>() == want);
  }
  for (const Tensor& loss : kept) CHECK(loss.item<float>() == want);
}

TEST_CASE("mixing devices in one op raises an Error naming the op and both devices",
          "[cuda][runtime]") {
  const Tensor c = rand({2, 3}), d = rand({2, 3}).to(kCuda);
  // One matcher (Catch2's && of matchers keeps references to its parts, which a lambda returning
  // the combination would leave dangling).
  auto mentions_both = [](const std::string& op) {
    return Catch::Matchers::Predicate<std::string>(
        [op](const std::string& m) {
          return m.find(op) != std::string::npos && m.find("cpu") != std::string::npos &&
                 m.find("cuda:0") != std::string::npos;
        },
        "names " + op + ", cpu and cuda:0");
  };
  CHECK_THROWS_AS(F::add(c, d), Error);
  CHECK_THROWS_WITH(F::add(c, d), mentions_both("add"));
  CHECK_THROWS_WITH(F::mul(d, c), mentions_both("mul"));
  CHECK_THROWS_WITH(F::matmul(d, rand({3, 4})), mentions_both("matmul"));
  CHECK_THROWS_WITH(F::linear(d, rand({4, 3}).to(kCuda), rand({4})), mentions_both("linear"));
  CHECK_THROWS_WITH(F::where(F::greater(c, c), d, d), mentions_both("where"));
  CHECK_THROWS_WITH(F::softmax_cross_entropy(d, zeros({2}, DType::Int64)),
                    mentions_both("softmax_cross_entropy"));
  CHECK_THROWS_WITH(F::conv2d(rand({1, 3, 5, 5}).to(kCuda), rand({2, 3, 3, 3})),
                    mentions_both("conv2d"));
  CHECK_THROWS_WITH(F::concat({c, d}), mentions_both("concat"));
  CHECK_THROWS_AS(add_(d, c), Error);
  // A gradient on another device than its tensor.
  Tensor leaf = rand({2, 3}).to(kCuda).set_requires_grad();
  CHECK_THROWS_AS(F::mul(leaf, 2.0).backward(rand({2, 3})), Error);
  CHECK_THROWS_AS(leaf.set_grad(rand({2, 3})), Error);
}

TEST_CASE("a missing device and an impossible allocation raise an Error", "[cuda][runtime]") {
  const int count = cuda::device_count();
  CHECK(count >= 1);
  CHECK(cuda::is_built());
  CHECK(cuda::unavailable_reason().empty());
  CHECK_THROWS_AS(rand({2}).to(Device::cuda(count)), Error);
  CHECK_THROWS_AS(zeros({2}, DType::Float32, Device::cuda(count)), Error);
  // 2^45 floats: 128 TiB, more than any device has.
  CHECK_THROWS_AS(Tensor::empty({int64_t{1} << 45}, DType::Float32, kCuda), Error);
  // The device still works.
  CHECK(F::sum(ones({1000}, DType::Float32, kCuda)).item<float>() == 1000.0f);
}

// ---- The caching allocator -----------------------------------------------------------------

TEST_CASE("the cuda allocator counts bytes, peak and allocations, and caches blocks",
          "[cuda][runtime][allocator]") {
  Allocator& alloc = allocator_for(kCuda);
  CHECK(&alloc == &allocator_for(Device::cuda(0)));
  const AllocatorStats start = cuda_stats();
  SECTION("bytes in use return to the start when tensors die") {
    alloc.reset_peak();
    {
      const Tensor a = Tensor::empty({1 << 20}, DType::Float32, kCuda);  // 4 MiB
      const Tensor b = Tensor::empty({1000}, DType::Float64, kCuda);
      const AllocatorStats s = cuda_stats();
      CHECK(s.bytes_in_use >= start.bytes_in_use + (4 << 20) + 8000);
      CHECK(s.live_blocks == start.live_blocks + 2);
      CHECK(s.allocation_count == start.allocation_count + 2);
      CHECK(s.peak_bytes >= s.bytes_in_use);
    }
    const AllocatorStats end = cuda_stats();
    CHECK(end.bytes_in_use == start.bytes_in_use);
    CHECK(end.live_blocks == start.live_blocks);
    CHECK(end.peak_bytes >= start.bytes_in_use + (4 << 20) + 8000);
    CHECK(end.bytes_cached >= (4 << 20));  // kept for reuse, not freed
    alloc.reset_peak();
    CHECK(cuda_stats().peak_bytes == end.bytes_in_use);
  }
  SECTION("a steady training loop reaches cudaMalloc no more") {
    manual_seed(3);
    auto net = nn::mlp(64, 128, 10);
    net->to(kCuda);
    optim::Adam opt(net->parameters());
    const Tensor x = rand({32, 64}).to(kCuda);
    const Tensor t = zeros({32}, DType::Int64, kCuda);
    auto step = [&] {
      opt.zero_grad();
      Tensor loss = F::softmax_cross_entropy((*net)(x), t);
      loss.backward();
      opt.step();
      return loss;
    };
    for (int i = 0; i < 3; ++i) step();
    const AllocatorStats warm = cuda_stats();
    float last = 0;
    for (int i = 0; i < 20; ++i) last = step().item<float>();
    const AllocatorStats after = cuda_stats();
    CHECK(after.system_allocations == warm.system_allocations);
    CHECK(after.allocation_count > warm.allocation_count);
    CHECK(after.bytes_in_use == warm.bytes_in_use);
    CHECK(std::isfinite(last));
  }
  SECTION("empty_cache gives cached blocks back") {
    { const Tensor a = Tensor::empty({1 << 18}, DType::Float64, kCuda); }
    CHECK(cuda_stats().bytes_cached > 0);
    alloc.empty_cache();
    CHECK(cuda_stats().bytes_cached == 0);
    CHECK(cuda_stats().bytes_in_use == start.bytes_in_use);
  }
  SECTION("the cpu allocator is not charged for device tensors") {
    const int64_t cpu_before = allocator_for(Device::cpu()).stats().bytes_in_use;
    const Tensor a = Tensor::empty({1 << 20}, DType::Float32, kCuda);
    CHECK(allocator_for(Device::cpu()).stats().bytes_in_use < cpu_before + (1 << 20));
  }
}

// ---- Pinned memory and asynchronous copies ---------------------------------------------------

TEST_CASE("pin_memory gives page-locked cpu tensors whose copies may be asynchronous",
          "[cuda][runtime][pinned]") {
  const Tensor plain = pattern({3, 1000}, DType::Float32);
  CHECK_FALSE(plain.is_pinned());
  const AllocatorStats pinned_before = cuda::pinned_allocator().stats();
  const Tensor pinned = plain.pin_memory();
  CHECK(pinned.is_pinned());
  CHECK(pinned.device() == Device::cpu());
  CHECK_FALSE(pinned.is_same(plain));
  CHECK(same_bytes(pinned, plain));
  CHECK(pinned.pin_memory().is_same(pinned));  // already pinned
  CHECK(cuda::pinned_allocator().stats().bytes_in_use >= pinned_before.bytes_in_use + 12000);
  CHECK_FALSE(pinned.to(kCuda).is_pinned());
  CHECK_THROWS_AS(pinned.to(kCuda).pin_memory(), Error);  // only cpu tensors

  // Ops on the device after a non-blocking copy see the copied values.
  const Tensor d = pinned.to(kCuda, /*non_blocking=*/true);
  const Tensor doubled = F::mul(d, 2.0);
  cuda::synchronize();
  const std::vector<float> pv = plain.to_vector<float>(), dv = doubled.to_vector<float>();
  REQUIRE(dv.size() == pv.size());
  for (size_t i = 0; i < pv.size(); ++i) CHECK(dv[i] == 2 * pv[i]);
  // Into pinned memory and back, without blocking, for every dtype.
  for (DType dt : {DType::Float32, DType::Float64, DType::Int32, DType::Int64, DType::Bool}) {
    INFO(name(dt));
    const Tensor src = pattern({1001}, dt, 3).pin_memory();
    const Tensor there = src.to(kCuda, true);
    const Tensor back = there.to(Device::cpu(), true);
    CHECK(back.is_pinned());  // a non-blocking copy to the host lands in pinned memory
    cuda::synchronize();
    CHECK(same_bytes(back, src));
  }
}

TEST_CASE("a pinned source may die right after its non-blocking copy is queued",
          "[cuda][runtime][pinned]") {
  // Work queued ahead keeps the copy waiting while the source's block returns to the pinned
  // cache, is handed out again and overwritten: the copy must still read the original values.
  const Tensor a = rand({2048, 2048}).to(kCuda);
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    Tensor busy = a;
    for (int i = 0; i < 8; ++i) busy = F::matmul(busy, a);  // milliseconds of device work
    Tensor d;
    {
      const Tensor src = pattern({1 << 16}, DType::Float32, round).pin_memory();
      d = src.to(kCuda, /*non_blocking=*/true);
    }
    const Tensor reuse = zeros({1 << 16}).pin_memory();
    std::memset(reuse.raw_data(), 0xff, reuse.nbytes());
    cuda::synchronize();
    CHECK(same_bytes(on_host(d), pattern({1 << 16}, DType::Float32, round)));
  }
}

TEST_CASE("a BatchIterator with set_pin_memory gives pinned batches", "[cuda][runtime][data]") {
  const data::Dataset ds = data::synthetic_classification(70, 12, 3, 5);
  data::BatchIterator plain(ds, 32, /*shuffle=*/true, 9);
  data::BatchIterator pinned(ds, 32, /*shuffle=*/true, 9);
  pinned.set_pin_memory();
  Tensor xp, tp, xq, tq;
  int batches = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    while (plain.next(xp, tp)) {
      REQUIRE(pinned.next(xq, tq));
      ++batches;
      CHECK(xq.is_pinned());
      CHECK(tq.is_pinned());
      CHECK_FALSE(xp.is_pinned());
      CHECK(same_bytes(xq, xp));
      CHECK(same_bytes(tq, tp));
      const Tensor xd = xq.to(kCuda, true), td = tq.to(kCuda, true);
      cuda::synchronize();
      CHECK(same_bytes(on_host(xd), xp));
      CHECK(same_bytes(on_host(td), tp));
    }
    CHECK_FALSE(pinned.next(xq, tq));
  }
  CHECK(batches == 6);
}

// ---- Modules -------------------------------------------------------------------------------

namespace {

class ConvBnNet : public nn::Module {
 public:
  ConvBnNet()
      : conv(register_module(
            "conv", std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = 1}))),
        bn(register_module("bn", std::make_shared<nn::BatchNorm2d>(4))),
        fc(register_module("fc", std::make_shared<nn::Linear>(4 * 5 * 5, 3))) {}
  Tensor forward(const Tensor& x) override {
    return (*fc)(F::flatten(F::relu((*bn)((*conv)(x))), 1));
  }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Linear> fc;
};

}  // namespace

TEST_CASE("Module::to moves parameters and batch-norm running statistics", "[cuda][runtime][nn]") {
  manual_seed(21);
  auto cpu_net = std::make_shared<ConvBnNet>();
  manual_seed(21);
  auto net = std::make_shared<ConvBnNet>();
  const Tensor x = rand({6, 2, 5, 5}, DType::Float32, Device::cpu(), -1, 1);
  F::sum((*net)(x)).backward();  // gradients on the cpu, dropped by the move
  REQUIRE(net->conv->weight.grad().defined());
  // The cpu copy makes the same first step so the statistics match.
  F::sum((*cpu_net)(x)).backward();

  net->to(kCuda);
  const auto params = net->named_parameters(), cpu_params = cpu_net->named_parameters();
  REQUIRE(params.size() == cpu_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    INFO(params[i].first);
    const Tensor& p = params[i].second;
    CHECK(p.device() == kCuda);
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
    CHECK_FALSE(p.grad().defined());
    CHECK(bit_diff(on_host(p), cpu_params[i].second) == "");
  }
  for (const auto& [buffer_name, slot] : net->named_buffer_slots()) {
    INFO(buffer_name);
    CHECK(slot->device() == kCuda);
  }
  CHECK(net->bn->running_mean.device() == kCuda);
  CHECK(net->bn->running_var.device() == kCuda);
  CHECK(bit_diff(on_host(net->bn->running_mean), cpu_net->bn->running_mean) == "");
  CHECK(bit_diff(on_host(net->bn->running_var), cpu_net->bn->running_var) == "");

  // Training on the device: gradients and running statistics there, close to the cpu's.
  cpu_net->zero_grad();
  optim::SGD opt(net->parameters(), {.lr = 0.1}), cpu_opt(cpu_net->parameters(), {.lr = 0.1});
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    const Tensor xs = rand({6, 2, 5, 5}, DType::Float32, Device::cpu(), -1, 1);
    net->zero_grad();
    cpu_net->zero_grad();
    const Tensor loss = F::sum((*net)(xs.to(kCuda)));
    const Tensor cpu_loss = F::sum((*cpu_net)(xs));
    loss.backward();
    cpu_loss.backward();
    opt.step();
    cpu_opt.step();
    CHECK(loss.device() == kCuda);
    CHECK(net->conv->weight.grad().device() == kCuda);
    CHECK(loss.item<float>() == Approx(cpu_loss.item<float>()).epsilon(1e-4).margin(1e-4));
    const auto a = net->bn->running_mean.to_vector<float>();
    const auto b = cpu_net->bn->running_mean.to_vector<float>();
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).epsilon(1e-4).margin(1e-5));
  }
  net->eval();
  cpu_net->eval();
  const auto ye = (*net)(x.to(kCuda)).to_vector<float>(), ce = (*cpu_net)(x).to_vector<float>();
  for (size_t i = 0; i < ye.size(); ++i) CHECK(ye[i] == Approx(ce[i]).epsilon(1e-3).margin(1e-4));

  // And back.
  net->to(Device::cpu());
  CHECK(net->conv->weight.device() == Device::cpu());
  CHECK(net->bn->running_var.device() == Device::cpu());
  CHECK(net->conv->weight.requires_grad());
}

TEST_CASE("Module::to keeps a tied weight and a shared child one tensor", "[cuda][runtime][nn]") {
  auto a = std::make_shared<nn::Linear>(3, 3), b = std::make_shared<nn::Linear>(3, 3);
  b->weight = a->weight;  // tied, as an embedding and its output projection
  nn::Sequential net({a, std::make_shared<nn::Tanh>(), b, a});  // `a` shared too
  REQUIRE(net.parameters().size() == 3);
  net.to(kCuda);
  CHECK(a->weight.device() == kCuda);
  CHECK(b->weight.is_same(a->weight));
  CHECK(net.parameters().size() == 3);
  F::sum(net(rand({2, 3}).to(kCuda))).backward();
  CHECK(b->weight.grad().is_same(a->weight.grad()));
}

TEST_CASE("modules and optimizers made on cuda train there", "[cuda][runtime][nn]") {
  nn::Linear lin(8, 4, {.dtype = DType::Float64, .device = kCuda});
  CHECK(lin.weight.device() == kCuda);
  CHECK(lin.bias.device() == kCuda);
  nn::Conv2d conv(2, 3, 3, {.device = kCuda});
  CHECK(conv.weight.device() == kCuda);
  nn::BatchNorm2d bn(3, {.device = kCuda});
  CHECK(bn.gamma.device() == kCuda);
  CHECK(bn.running_mean.device() == kCuda);
  auto mlp = nn::mlp(8, 16, 4, {.device = kCuda});
  for (const Tensor& p : mlp->parameters()) CHECK(p.device() == kCuda);

  const Tensor x = rand({5, 8}, DType::Float64).to(kCuda);
  optim::MomentumSGD opt(lin.parameters(), {.lr = 0.05});
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    opt.zero_grad();
    const Tensor loss = F::mean_squared_error(lin(x), zeros({5, 4}, DType::Float64, kCuda));
    loss.backward();
    opt.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  CHECK(last < first);
}

TEST_CASE("tensor() and arange() place their values on cuda", "[cuda][runtime]") {
  const Tensor t = tensor({1.5, -2, 3}, {3}, DType::Float32, Device::cuda());
  CHECK(t.device() == Device::cuda());
  CHECK(t.to_vector<double>() == std::vector<double>{1.5, -2, 3});
  const Tensor a = arange(5, DType::Int64, Device::cuda());
  CHECK(a.device() == Device::cuda());
  CHECK(a.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
}
