// The convolution kernels' one setting: force im2col + GEMM for every convolution instead of
// the shifted register tiles (to compare the paths). ENCORE_CONV_IM2COL=1 in the environment
// turns it on when the library loads.
#pragma once

namespace encore::kernels::cpu {

// Sets whether im2col + GEMM is forced; returns the previous setting. A static plan reads it
// when it lays out padded inputs (runtime/padded_layout.h): a step it padded keeps the shifted
// path its signature was traced with.
bool set_conv_im2col(bool on);

}  // namespace encore::kernels::cpu
