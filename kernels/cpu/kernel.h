// What every CPU kernel file includes: the kernel contract (runtime/dispatcher.h) and the
// dtype switch.
#pragma once

#include "kernels/dtype_switch.h"
#include "runtime/dispatcher.h"
