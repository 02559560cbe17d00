// What every CPU kernel file includes: the kernel contract (runtime/kernel_abi.h) and the
// dtype switch.
#pragma once

#include "kernels/dtype_switch.h"
#include "runtime/kernel_abi.h"
