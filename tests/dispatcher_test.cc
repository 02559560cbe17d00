// The dispatcher's single call path: kernel lookup, autograd recording, tracer notification.
#include <catch2/catch.hpp>
#include "runtime/cuda.h"

#include <set>
#include <string>
#include <vector>

#include "encore/encore.h"

using namespace encore;
using Catch::Matchers::Contains;

namespace {

// Records every op the dispatcher executes, as a static-graph tracer would.
class RecordingTracer : public Tracer {
 public:
  struct Call {
    Op op;
    std::vector<Shape> in, out;
    std::vector<const void*> in_data, out_data;
    AttrBlob attrs;
  };
  void on_op(Op op, const AttrBlob& attrs, std::span<const Tensor> inputs,
             std::span<const Tensor> outputs) override {
    Call c{op, {}, {}, {}, {}, attrs};
    for (const Tensor& t : inputs) {
      c.in.push_back(t.shape());
      c.in_data.push_back(t.raw_data());
    }
    for (const Tensor& t : outputs) {
      c.out.push_back(t.shape());
      c.out_data.push_back(t.raw_data());
    }
    calls.push_back(c);
  }
  void on_host_read(const Tensor&, std::string_view what) override {
    host_reads.emplace_back(what);
  }
  void on_grad_set(const Tensor& leaf, const Tensor& grad) override {
    grads_set.emplace_back(leaf.raw_data(), grad.raw_data());
  }
  std::vector<std::pair<const void*, const void*>> grads_set;
  std::vector<Call> calls;
  std::vector<std::string> host_reads;
};

std::vector<Op> ops_of(const RecordingTracer& t) {
  std::vector<Op> ops;
  for (const auto& c : t.calls) ops.push_back(c.op);
  return ops;
}

}  // namespace

TEST_CASE("a tracer sees every forward op with its operands", "[dispatcher]") {
  Tensor x = rand({4, 3});
  Tensor w = rand({2, 3});
  RecordingTracer tracer;
  Tensor y;
  {
    TracerScope scope(&tracer);
    CHECK(current_tracer() == &tracer);
    y = F::relu(F::linear(x, w));
  }
  CHECK(current_tracer() == nullptr);
  REQUIRE(ops_of(tracer) == std::vector<Op>{Op::Linear, Op::Relu});
  const auto& lin = tracer.calls[0];
  CHECK(lin.in == std::vector<Shape>{Shape{4, 3}, Shape{2, 3}});
  CHECK(lin.out == std::vector<Shape>{Shape{4, 2}});
  CHECK(lin.in_data[0] == x.raw_data());
  // The relu reads exactly the buffer the linear wrote: value identity is recoverable.
  CHECK(tracer.calls[1].in_data[0] == lin.out_data[0]);
  CHECK(tracer.calls[1].out_data[0] == y.raw_data());
}

TEST_CASE("a tracer sees backward ops, views and in-place updates", "[dispatcher]") {
  Tensor x = rand({2, 3}).set_requires_grad();
  RecordingTracer tracer;
  {
    TracerScope scope(&tracer);
    Tensor loss = F::sum(F::reshape(F::tanh(x), {6}));
    loss.backward();
    NoGradGuard g;
    optim::SGD opt({x}, {.lr = 0.1});
    opt.step();
  }
  const auto ops = ops_of(tracer);
  auto has = [&](Op op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
  CHECK(has(Op::Tanh));
  CHECK(has(Op::Reshape));  // a view, recorded though no kernel runs
  CHECK(has(Op::Sum));
  CHECK(has(Op::Fill));      // the implicit gradient of the scalar loss
  CHECK(has(Op::TanhGrad));  // backward formulas pass through the dispatcher
  CHECK(has(Op::SgdUpdate));
  // The first gradient of x became its .grad: the tracer is told which buffer that is.
  REQUIRE(tracer.grads_set.size() == 1);
  CHECK(tracer.grads_set[0].first == x.raw_data());
  CHECK(tracer.grads_set[0].second == x.grad().raw_data());
  // Reshape's attributes are empty, SGD's carry the learning rate.
  for (const auto& c : tracer.calls)
    if (c.op == Op::SgdUpdate) CHECK(c.attrs.as<SgdAttrs>().lr == 0.1);
}

TEST_CASE("host reads are reported to the tracer", "[dispatcher]") {
  Tensor x = ones({3});
  RecordingTracer tracer;
  {
    TracerScope scope(&tracer);
    (void)F::sum(x).item<float>();
    (void)x.to_vector<float>();
    x.data<float>()[0] = 2;
  }
  CHECK(tracer.host_reads == std::vector<std::string>{"item", "to_vector", "data"});
}

TEST_CASE("tracer scopes nest and restore", "[dispatcher]") {
  RecordingTracer outer, inner;
  {
    TracerScope a(&outer);
    (void)F::exp(ones({1}));
    {
      TracerScope b(&inner);
      (void)F::log(ones({1}));
    }
    (void)F::neg(ones({1}));
  }
  CHECK(ops_of(inner) == std::vector<Op>{Op::Fill, Op::Log});
  CHECK(ops_of(outer) == std::vector<Op>{Op::Fill, Op::Exp, Op::Fill, Op::Neg});
}

TEST_CASE("kernels are found for every op on the cpu", "[dispatcher]") {
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    if (op_kind(op) == OpKind::View) continue;
    INFO(op_name(op));
    CHECK(lookup_kernel(op, DeviceType::CPU) != nullptr);
  }
}

TEST_CASE("a missing backend or kernel is an error naming the op", "[dispatcher]") {
#ifdef ENCORE_HAS_CUDA
  // Every op has a CUDA kernel, and so have the planner-made ops CUDA plans hold (a linear and its
  // activation, a product and an activation gradient, a weight and a bias gradient, over small
  // products); the device may still be missing.
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    if (op_kind(op) == OpKind::View || op_traits(op).outputs < 0) continue;
    INFO(op_name(op));
    CHECK(lookup_kernel(op, DeviceType::CUDA) != nullptr);
  }
  for (const Op op : {Op::LinearAct, Op::MatmulActGrad, Op::WeightBiasGrad, Op::LossGradMatmul,
                      Op::WeightGradAdam}) {
    INFO(op_name(op));
    CHECK(lookup_kernel(op, DeviceType::CUDA) != nullptr);
  }
  if (!cuda::is_available())
    CHECK_THROWS_WITH(Tensor::empty({2}, DType::Float32, Device::cuda(0)),
                      Contains("cuda:0") && Contains(cuda::unavailable_reason()));
#else
  CHECK_THROWS_WITH(lookup_kernel(Op::Relu, DeviceType::CUDA),
                    Contains("relu") && Contains("cuda"));
  CHECK_THROWS_WITH(Tensor::empty({2}, DType::Float32, Device::cuda(0)), Contains("cuda:0"));
#endif
  CHECK_THROWS_WITH(Tensor::empty({2}, DType::Float32, Device::cuda(9)), Contains("cuda:9"));
}

TEST_CASE("a kernel can be called directly on raw buffers", "[dispatcher]") {
  // The replay path: same kernel, other buffers, no tensors or autograd.
  float a[4] = {1, 2, 3, 4}, b[2] = {10, 20}, out[4] = {};
  const BufferView views[] = {
      {a, {2, 2}, DType::Float32}, {b, {2}, DType::Float32}, {out, {2, 2}, DType::Float32}};
  const AttrBlob attrs;
  lookup_kernel(Op::Add,
                DeviceType::CPU)(KernelArgs{std::span(views, 2), std::span(views + 2, 1), attrs});
  CHECK(std::vector<float>(out, out + 4) == std::vector<float>{11, 22, 13, 24});
}

TEST_CASE("every op has a name and differentiable ops a backward", "[dispatcher]") {
  std::set<std::string_view> names;
  for (int i = 0; i < kNumOps; ++i) names.insert(op_name(static_cast<Op>(i)));
  CHECK(names.size() == static_cast<size_t>(kNumOps));
  for (Op op : {Op::Add, Op::Mul, Op::Matmul, Op::Linear, Op::Sum, Op::Max, Op::Reshape, Op::Concat,
                Op::Slice, Op::Softmax, Op::SoftmaxCrossEntropy, Op::Where}) {
    INFO(op_name(op));
    CHECK(backward_def(op).fn != nullptr);
  }
  for (Op op : {Op::Equal, Op::Accuracy, Op::ReluGrad, Op::Fill, Op::AdamUpdate})
    CHECK(backward_def(op).fn == nullptr);
}

TEST_CASE("detach is visible to a tracer as an alias", "[dispatcher]") {
  Tensor w = rand({3}).set_requires_grad();
  RecordingTracer tracer;
  Tensor d;
  {
    TracerScope scope(&tracer);
    d = F::mul(w, 2.0).detach();
  }
  REQUIRE(ops_of(tracer) == std::vector<Op>{Op::MulScalar, Op::Alias});
  CHECK(tracer.calls[1].in_data[0] == tracer.calls[0].out_data[0]);
  CHECK(tracer.calls[1].out_data[0] == d.raw_data());
}

TEST_CASE("ops that draw random numbers are marked for replay", "[dispatcher]") {
  CHECK(op_draws_random(Op::UniformInit));
  CHECK(op_draws_random(Op::NormalInit));
  CHECK_FALSE(op_draws_random(Op::Add));
  // Each draw reserves a fresh stream, so two draws differ.
  RecordingTracer tracer;
  {
    TracerScope scope(&tracer);
    (void)rand({5});
    (void)rand({5});
  }
  REQUIRE(tracer.calls.size() == 2);
  CHECK(tracer.calls[0].attrs.as<RandomAttrs>().offset !=
        tracer.calls[1].attrs.as<RandomAttrs>().offset);
}
