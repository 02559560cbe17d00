// Gradient clipping, as torch.nn.utils.clip_grad_norm_ and clip_grad_value_: between backward()
// and the optimizer's step().
//
//   loss.backward();
//   nn::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
//   opt.step();
//
// Both write the parameters' .grad in place with ops and read nothing on the host (the norm stays
// a device tensor, as PyTorch's), so a static training step records them with the backward and
// its replays clip too. Parameters without a .grad are skipped. The gradients must share one
// device and one dtype; else an Error, and nothing is written.
#pragma once

#include <vector>

#include "runtime/tensor.h"

namespace encore::nn {

// Scales the gradients by min(1, max_norm / (total + 1e-6)), where total is the norm of all of
// them seen as one vector: the norm_type-norm (norm_type > 0, or INFINITY for the largest
// magnitude). Returns total, a 0-d tensor of the gradients' dtype and device (0 when none has a
// gradient: a float32 cpu tensor). A NaN or infinite total makes every gradient NaN, as
// PyTorch's; error_if_nonfinite makes it an Error instead (gradients left as they were), which
// reads the total on the host: an eager-only check, refused inside a static function.
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// Clamps every gradient element to [-clip_value, clip_value] (clip_value >= 0); NaN stays NaN.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace encore::nn
