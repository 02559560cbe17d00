// Checkpoints in the safetensors format: a module's parameters and buffers, optionally an
// optimizer's state and a generator's state, in one file that PyTorch's `safetensors` reads.
//
//   encore::save("run.safetensors", *model, &opt, &default_generator(Device::cpu()));
//   ...
//   auto model2 = nn::mlp(784, 100, 10);
//   optim::Adam opt2(model2->parameters());
//   encore::load("run.safetensors", *model2, &opt2, &default_generator(Device::cpu()));
//   // training goes on bit for bit as if it had never stopped
//
// The file: an 8-byte little-endian header length, a JSON header mapping each tensor's name to
// {"dtype": "F32" | "F64" | "I32" | "I64" | "BOOL", "shape": [...], "data_offsets": [begin, end)}
// (relative to the data after the header), then the raw little-endian data. Names follow the
// module tree (named_parameters() and the buffers, e.g. "c1.weight", "bn.running_mean"); the
// optimizer's state is under "optimizer." ("optimizer.0.m", "optimizer.0.t"). "__metadata__"
// holds strings: "format" ("encore.checkpoint"), "format_version" ("1"), "optimizer.kind",
// "optimizer.steps", "optimizer.<hyper-parameter>" and "generator.seed" / "generator.offset".
#pragma once

#include <string>
#include <vector>

#include "encore/nn.h"
#include "encore/optim.h"
#include "runtime/rng.h"

namespace encore {

// Writes `module` (and `optimizer`'s state and hyper-parameters, and `generator`'s seed and
// offset, where given) to `path`: to a temporary file in the same directory, renamed over `path`
// once complete, so `path` holds either the old or the new checkpoint.
void save(const std::string& path, const nn::Module& module, optim::Optimizer* optimizer = nullptr,
          Generator* generator = nullptr);

struct LoadOptions {
  // A module tensor missing from the file, or a file tensor the module (or the optimizer) lacks,
  // is an Error. Non-strict loads what matches and returns the other names; from a file saved
  // without an optimizer it loads the module, and the optimizer keeps its state, hyper-parameters
  // and step count (its state tensors that exist are returned as missing).
  bool strict = true;
};

struct LoadResult {
  std::vector<std::string> missing;     // module or optimizer tensors the file lacks
  std::vector<std::string> unexpected;  // file tensors nothing takes
};

// Reads `path` into `module` (and `optimizer` and `generator`, where given; the file's optimizer
// entries and generator state are ignored otherwise). Tensors are written in place. Everything is
// checked before anything changes: a malformed file, a shape or dtype differing from the module's
// tensor, another optimizer kind, or (strict) a missing or unexpected tensor is an Error naming
// the file and the tensor, and leaves module, optimizer and generator exactly as they were.
// The optimizer's hyper-parameters and step counts are those of the file after a load.
LoadResult load(const std::string& path, nn::Module& module, optim::Optimizer* optimizer = nullptr,
                Generator* generator = nullptr, LoadOptions options = {});

}  // namespace encore
