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
// magnitude; a gradient with no element counts 0). Returns total, a 0-d tensor of the
// gradients' dtype and device (0 when none has a gradient: a float32 cpu tensor). PyTorch takes
// each gradient's norm, then the norm of those, so its total (and so the scaled gradients) can
// differ from this one in the last bits. As in PyTorch, a NaN total makes every gradient NaN,
// and an infinite one (an infinite element, or squares beyond the dtype's range) scales them by
// 0: finite elements become 0, infinite ones NaN. error_if_nonfinite makes either an Error
// instead (gradients left as they were); it reads the total on the host, which a static
// function does not replay: a trace refuses it (see StaticOptions::on_unsafe).
Tensor clip_grad_norm_(const std::vector<Tensor>& parameters, double max_norm,
                       double norm_type = 2.0, bool error_if_nonfinite = false);

// Clamps every gradient element to [-clip_value, clip_value] (clip_value >= 0); NaN stays NaN.
void clip_grad_value_(const std::vector<Tensor>& parameters, double clip_value);

}  // namespace encore::nn
