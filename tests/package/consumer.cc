#include <cstdio>

#include "encore/encore.h"

int main() {
  using namespace encore;
  Tensor w = ones({2, 3}).set_requires_grad();
  Tensor loss = F::sum(F::linear(ones({4, 3}), w));
  loss.backward();
  const double g = F::sum(w.grad()).item<double>();  // every weight sees 4 ones
  std::printf("consumer: grad sum %g\n", g);
  return g == 24.0 ? 0 : 1;
}
