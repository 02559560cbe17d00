#include "runtime/fused.h"

namespace encore {

bool fusable_op(Op op) {
  if (op_has_scalar_attrs(op)) return op != Op::Fill;  // x op s, leaky_relu and its gradient
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Relu:
    case Op::Sigmoid:
    case Op::Tanh:
    case Op::ReluGrad:
    case Op::SigmoidGrad:
    case Op::TanhGrad:
      return true;
    default:
      return false;
  }
}

}  // namespace encore
