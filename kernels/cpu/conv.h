// The convolution kernels' one setting: force im2col + GEMM for every convolution instead of
// the shifted register tiles (to compare the paths). ENCORE_CONV_IM2COL=1 in the environment
// turns it on when the library loads.
#pragma once

namespace encore::kernels::cpu {

// Sets whether im2col + GEMM is forced; returns the previous setting.
bool set_conv_im2col(bool on);

}  // namespace encore::kernels::cpu
