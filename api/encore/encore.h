// encore: define-by-run tensors, autograd, modules and optimizers on a dispatcher that a
// static-graph tracer can record. Include this one header.
#pragma once

#include "encore/checkpoint.h"
#include "encore/clip_grad.h"
#include "encore/data.h"
#include "encore/functions.h"
#include "encore/lr_scheduler.h"
#include "encore/models.h"
#include "encore/nn.h"
#include "encore/nn_sequence.h"
#include "encore/onnx.h"
#include "encore/optim.h"
#include "encore/profiler.h"
#include "encore/static_graph.h"
#include "runtime/allocator.h"
#include "runtime/autograd.h"
#include "runtime/dispatcher.h"
#include "runtime/parallel.h"
#include "runtime/rng.h"
#include "runtime/tensor.h"
