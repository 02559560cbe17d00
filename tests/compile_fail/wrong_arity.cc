// Must not compile: a static function of two tensors called with one. The build test checks the
// compiler's message states the expected call.
#include "encore/encore.h"
#include "encore/static_graph.h"

int main() {
  auto fn = encore::static_graph(
      [](const encore::Tensor& a, const encore::Tensor& b) { return encore::F::add(a, b); });
  fn(encore::ones({2}));
}
