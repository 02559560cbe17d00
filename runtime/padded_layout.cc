// The cpu kernels' answers about padded layouts (padded_layout.h).
#include "runtime/padded_layout.h"

namespace encore {
namespace {

PaddedLayoutQueries& queries() {
  static PaddedLayoutQueries q;
  return q;
}

}  // namespace

void register_cpu_padded_layouts(PaddedLayoutQueries q) {
  queries() = q;
}

const PaddedLayoutQueries& cpu_padded_layouts() {
  return queries();
}

}  // namespace encore
