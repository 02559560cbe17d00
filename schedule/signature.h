// The signature a cache entry is matched by, its text for reports, and the changes between two
// signatures that name why a call retraced. Internal to schedule/.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/tensor.h"
#include "schedule/static_graph.h"

namespace encore::schedule::detail {

struct ArgSig {
  Shape shape;
  DType dtype;
  Device device;
  bool requires_grad;
  // Aliasing between arguments: the first earlier argument that is this very tensor (the
  // function's graph then has one leaf for both), and the first earlier argument on the same
  // storage with the byte offset from it (the schedule binds one buffer per storage and offset).
  int same_as = -1;
  int shares_with = -1;
  int64_t shared_offset = 0;
  // An undefined tensor (an optional state left out): the call passes the function an undefined
  // tensor there, and the other fields are unused.
  bool defined = true;
};

struct Signature {
  std::vector<ArgSig> args;
  bool grad = true;
  int64_t mode = -1;
  std::string key;
};

Signature signature_of(std::span<const Tensor> args, const std::string* key, int64_t mode);
bool matches(const Signature& s, std::span<const Tensor> args, const std::string* key, bool grad,
             int64_t mode);
// Whether the arguments alias one another as the signature's did.
bool same_aliasing(const Signature& s, std::span<const Tensor> args);

// "argument 0 'x'", or "argument 0" when the function did not name it.
std::string arg_label(const Config& c, size_t i);
std::string describe(const Signature& s, const Config& c);
// The same with some dimensions named (`dims[i][d]` non-empty): "x: float32[s0,784] ...".
std::string describe(const Signature& s, const Config& c,
                     const std::vector<std::vector<std::string>>& dims);

// One change between signatures: what changed (for the storm warning) and the full text.
struct Change {
  std::string subject;  // "argument 0 'x' dim 0"
  std::string text;     // "argument 0 'x' dim 0 changed 32 -> 17"
  int64_t value = -1;   // the new size when a dimension changed
  int arg = -1, dim = -1;  // which, when a dimension changed
};

std::vector<Change> diff(const Signature& old, const Signature& now, const Config& c);

}  // namespace encore::schedule::detail
