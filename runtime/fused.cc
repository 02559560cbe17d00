#include "runtime/fused.h"

namespace encore {

bool fusable_op(Op op) {
  switch (op) {
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::AddScalar:
    case Op::MulScalar:
    case Op::RsubScalar:
    case Op::DivScalar:
    case Op::RdivScalar:
    case Op::PowScalar:
    case Op::LeakyRelu:
    case Op::Neg:
    case Op::Exp:
    case Op::Log:
    case Op::Sqrt:
    case Op::Relu:
    case Op::Sigmoid:
    case Op::Tanh:
    case Op::ReluGrad:
    case Op::LeakyReluGrad:
    case Op::SigmoidGrad:
    case Op::TanhGrad:
      return true;
    default:
      return false;
  }
}

}  // namespace encore
