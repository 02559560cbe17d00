// The kernel ABI (runtime/kernel_abi.h) and the op traits table (runtime/op_traits.h): attribute
// blobs carry the type of the struct written into them, the dispatcher refuses a call whose
// attributes are not its op's, and the table's per-op properties.
#include <catch2/catch.hpp>

#include <set>
#include <vector>

#include "encore/encore.h"

using namespace encore;
using Catch::Matchers::Contains;

namespace {

std::set<Op> ops_where(bool (*property)(Op)) {
  std::set<Op> ops;
  for (int i = 0; i < kNumOps; ++i)
    if (property(static_cast<Op>(i))) ops.insert(static_cast<Op>(i));
  return ops;
}

}  // namespace

TEST_CASE("an attribute blob knows the struct written into it", "[kernel_abi]") {
  const AttrBlob scalar = AttrBlob::of(ScalarAttrs{2.5});
  CHECK(scalar.holds<ScalarAttrs>());
  CHECK_FALSE(scalar.holds<MatmulAttrs>());
  CHECK(scalar.as<ScalarAttrs>().value == 2.5);
  CHECK(AttrBlob().holds<NoAttrs>());
  CHECK(AttrBlob::of(NoAttrs{}).holds<NoAttrs>());
  CHECK(AttrBlob::of(Pool2dAttrs{}).type == attr_type_of<Pool2dAttrs>);
  // A copy keeps the tag (schedules store blobs by value).
  const AttrBlob copy = scalar;
  CHECK(copy.holds<ScalarAttrs>());
}

TEST_CASE("a call whose attributes are not its op's struct is refused", "[kernel_abi]") {
  Tensor x = full({4}, 1.0);
  Tensor y = full({4}, 7.0);
  // add_scalar reads a ScalarAttrs: a MatmulAttrs blob would be read as a garbage scalar.
  CHECK_THROWS_WITH(dispatch(Op::AddScalar, {x}, {y}, AttrBlob::of(MatmulAttrs{true, false})),
                    Contains("add_scalar") && Contains("MatmulAttrs") && Contains("ScalarAttrs"));
  // No attributes where the op reads some, and attributes where it reads none.
  CHECK_THROWS_WITH(dispatch(Op::Sum, {x}, {y}), Contains("sum") && Contains("ReduceAttrs"));
  CHECK_THROWS_WITH(dispatch(Op::Relu, {x}, {y}, AttrBlob::of(ScalarAttrs{1})),
                    Contains("relu") && Contains("NoAttrs"));
  // The kernel did not run.
  CHECK(y.to_vector<float>() == std::vector<float>(4, 7.0f));
  // The op's own struct goes through.
  dispatch(Op::AddScalar, {x}, {y}, AttrBlob::of(ScalarAttrs{2}));
  CHECK(y.to_vector<float>() == std::vector<float>(4, 3.0f));
}

TEST_CASE("every op declares the attribute struct its routine writes", "[kernel_abi]") {
  CHECK(op_attr_type(Op::Add) == AttrType::None);
  CHECK(op_attr_type(Op::LeakyReluGrad) == AttrType::Scalar);
  CHECK(op_attr_type(Op::Conv2dGradWeight) == AttrType::Conv2d);
  CHECK(op_attr_type(Op::Dropout) == AttrType::Random);
  CHECK(op_attr_type(Op::FusedElementwise) == AttrType::Fused);
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = static_cast<Op>(i);
    INFO(op_name(op));
    CHECK(op_draws_random(op) ==
          (op == Op::Dropout || op == Op::UniformInit || op == Op::NormalInit));
    CHECK_FALSE(attr_type_name(op_attr_type(op)).empty());
  }
}

TEST_CASE("the op traits table's properties", "[kernel_abi]") {
  const std::set<Op> scalar = {Op::AddScalar,  Op::MulScalar, Op::RsubScalar, Op::DivScalar,
                               Op::RdivScalar, Op::PowScalar, Op::LeakyRelu,  Op::LeakyReluGrad,
                               Op::Gelu,       Op::GeluGrad,  Op::Fill};
  CHECK(ops_where(op_has_scalar_attrs) == scalar);
  std::set<Op> fusable = {Op::Add,  Op::Sub,      Op::Mul,         Op::Div,     Op::Neg,
                          Op::Exp,  Op::Log,      Op::Sqrt,        Op::Relu,    Op::Sigmoid,
                          Op::Tanh, Op::ReluGrad, Op::SigmoidGrad, Op::TanhGrad};
  for (Op op : scalar)
    if (op != Op::Fill) fusable.insert(op);
  std::set<Op> elementwise = fusable;
  elementwise.insert(Op::Copy);
  fusable.insert(Op::Where);  // not elementwise: its condition is bool
  CHECK(ops_where(op_fusable) == fusable);
  CHECK(ops_where(op_elementwise) == elementwise);
  CHECK(ops_where(op_broadcasts_one) == std::set<Op>{Op::Add, Op::Sub, Op::Mul, Op::Div});
  std::set<Op> fusable_two;
  for (Op op : fusable)
    if (op_reads_two(op)) fusable_two.insert(op);
  CHECK(fusable_two == std::set<Op>{Op::Add, Op::Sub, Op::Mul, Op::Div, Op::ReluGrad,
                                    Op::LeakyReluGrad, Op::SigmoidGrad, Op::TanhGrad,
                                    Op::GeluGrad});
  CHECK(ops_where(op_row_fusable) == std::set<Op>{Op::Sum, Op::Mean, Op::Max, Op::Softmax,
                                                  Op::LogSoftmax, Op::SoftmaxGrad,
                                                  Op::LogSoftmaxGrad, Op::LayerNorm});
  CHECK(ops_where(op_optimizer_update) ==
        std::set<Op>{Op::SgdUpdate, Op::MomentumSgdUpdate, Op::AdamUpdate});
  CHECK(op_mutated_inputs(Op::AdamUpdate) == 0b11101);
  CHECK(op_kind(Op::Reshape) == OpKind::View);
}
