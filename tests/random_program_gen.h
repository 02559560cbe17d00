// The generator of random programs (random_program.h): build() draws a program from its seed,
// with shapes that fit every op it emits and values kept finite.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "random_program.h"

namespace encore::random_program {

class ProgramGenerator {
 public:
  explicit ProgramGenerator(uint64_t seed) : rng_(seed) { p_.seed = seed; }

  Program build() {
    p_.dtype = chance(0.5) ? DType::Float32 : DType::Float64;
    // An image program starts from an NCHW argument (the others are variants of it).
    const bool image = chance(0.35);
    Dims base;
    if (image) base = image_dims();
    for (int64_t i = 0, r = between(1, 4); !image && i < r; ++i) base.push_back(between(1, 6));
    for (int64_t i = 0, n = between(1, kMaxFloatArgs); i < n; ++i)
      new_leaf(image && i == 0 ? base : variant(base), false, chance(0.6));
    if (chance(0.4)) new_leaf(variant(base), true, chance(0.85));
    std::vector<int> grad_leaves;
    for (const Leaf& l : p_.leaves)
      if (p_.values[l.value].requires_grad) grad_leaves.push_back(l.value);
    if (grad_leaves.empty()) {
      p_.values[p_.leaves[0].value].requires_grad = true;
      grad_leaves.push_back(p_.leaves[0].value);
    }

    // The first step reads a leaf that needs a gradient, so some result does.
    const int first = grad_leaves[between(0, static_cast<int64_t>(grad_leaves.size()) - 1)];
    while (!try_emit(random_op(), first)) {
    }
    const int64_t target = between(4, 18);
    while (static_cast<int64_t>(p_.steps.size()) < target) try_emit(random_op(), -1);

    int out0 = -1;
    for (int v = static_cast<int>(p_.values.size()) - 1; v >= 0 && out0 < 0; --v)
      if (p_.values[v].leaf < 0 && p_.values[v].requires_grad) out0 = v;
    p_.outputs.push_back(out0);
    if (chance(0.4)) {
      std::vector<int> others;
      for (const Step& s : p_.steps)
        if (s.out != out0) others.push_back(s.out);
      if (!others.empty()) {
        p_.outputs.push_back(others[between(0, static_cast<int64_t>(others.size()) - 1)]);
        if (chance(0.5)) std::swap(p_.outputs[0], p_.outputs[1]);
      }
    }
    // A dropout that draws makes every call random; its result is often an output too, so that
    // fresh masks show in what the caller gets.
    std::vector<int> drops;
    for (const Step& s : p_.steps)
      if (s.op == OpKind::Dropout && s.flag && s.scalar > 0) drops.push_back(s.out);
    p_.random = !drops.empty();
    if (!drops.empty() && chance(0.5)) {
      const int d = drops[between(0, static_cast<int64_t>(drops.size()) - 1)];
      if (std::find(p_.outputs.begin(), p_.outputs.end(), d) == p_.outputs.end())
        p_.outputs.push_back(d);
    }
    p_.scalar_loss = chance(0.3);
    p_.update_params = chance(0.5);
    p_.preset_grads = chance(0.2);
    p_.param_grads = static_cast<GradState>(between(0, 2));
    alias_arguments();
    return std::move(p_);
  }

 private:
  int64_t between(int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(double p) { return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < p; }

  OpKind random_op() {
    int total = 0;
    for (const OpInfo& o : kOps) total += o.weight;
    int64_t r = between(0, total - 1);
    for (int k = 0;; r -= kOps[k++].weight)
      if (r < kOps[k].weight) return static_cast<OpKind>(k);
  }

  const Value& val(int v) const { return p_.values[v]; }
  Dims shape(int v) const { return p_.values[v].shape; }
  int rank(int v) const { return rank_of(p_.values[v].shape); }

  // A small [N,C,H,W].
  Dims image_dims() { return {between(1, 3), between(1, 4), between(3, 8), between(3, 8)}; }

  // The base shape with some leading dimensions dropped and some set to 1.
  Dims variant(const Dims& base) {
    const int64_t drop = chance(0.3) ? between(0, static_cast<int64_t>(base.size()) - 1) : 0;
    Dims d(base.begin() + drop, base.end());
    for (int64_t& x : d)
      if (chance(0.2)) x = 1;
    return d;
  }

  int add_value(Dims shape, bool requires_grad, double bound) {
    p_.values.push_back({std::move(shape), requires_grad, bound});
    return static_cast<int>(p_.values.size()) - 1;
  }

  // Sometimes passes one float argument as another (when their shapes and requires_grad agree)
  // or as a view overlapping it in one storage. Drawn from a generator of its own, so the rest
  // of the program is what the seed gave before.
  void alias_arguments() {
    std::mt19937_64 rng(p_.seed ^ 0xa11a5ed0a11a5ed0ull);
    auto draw = [&rng](int64_t n) {
      return static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    };
    std::vector<const Leaf*> floats;
    for (const Leaf& l : p_.leaves)
      if (!l.param && !val(l.value).labels) floats.push_back(&l);
    if (floats.size() < 2 || draw(10) >= 4) return;
    const Leaf& a = *floats[draw(static_cast<int64_t>(floats.size()))];
    const Leaf* b = nullptr;
    for (const Leaf* l : floats)
      if (l != &a && (b == nullptr || draw(2) == 0)) b = l;
    const Leaf& first = a.index < b->index ? a : *b;
    const Leaf& second = a.index < b->index ? *b : a;
    p_.alias_of = first.index;
    p_.alias_arg = second.index;
    p_.alias_same = val(first.value).shape == val(second.value).shape &&
                    val(first.value).requires_grad == val(second.value).requires_grad &&
                    draw(2) == 0;
    if (!p_.alias_same) p_.alias_shift = draw(numel_of(val(first.value).shape) + 1);
  }

  bool can_add_leaf(bool param) const {
    return param ? p_.num_params < kMaxParams : p_.num_args < kMaxFloatArgs;
  }

  int new_leaf(Dims shape, bool param, bool requires_grad) {
    const int v = add_value(std::move(shape), requires_grad, param ? 1 : 2);
    Leaf l;
    l.value = v;
    l.param = param;
    l.index = param ? p_.num_params++ : p_.num_args++;
    p_.values[v].leaf = static_cast<int>(p_.leaves.size());
    p_.leaves.push_back(l);
    return v;
  }

  // A new leaf of `shape`: a parameter when `prefer_param` and one is left, else an argument.
  int new_leaf_of(const Dims& shape, bool prefer_param, double grad_chance) {
    if (numel_of(shape) > kMaxNumel) return -1;
    bool param = prefer_param ? can_add_leaf(true) : !can_add_leaf(false);
    if (!can_add_leaf(param)) return -1;
    return new_leaf(shape, param, chance(grad_chance));
  }

  int emit(OpKind op, std::vector<int> in, Dims out_shape, double bound,
           std::vector<int64_t> ints = {}, double scalar = 0, bool flag = false) {
    bool rg = false;
    for (int v : in) rg = rg || (!val(v).labels && val(v).requires_grad);
    const int out = add_value(std::move(out_shape), rg, bound);
    p_.steps.push_back({op, out, std::move(in), std::move(ints), scalar, flag});
    return out;
  }

  // tanh(v) when v may exceed `limit`, else v.
  int squash(int v, double limit) {
    if (val(v).bound <= limit) return v;
    return emit(OpKind::Tanh, {v}, shape(v), 1);
  }

  // A floating value satisfying `pred`, recent ones preferred; `forced` when given (or -1 when
  // it does not satisfy pred).
  template <typename Pred>
  int pick(Pred pred, int forced = -1) {
    auto ok = [&](int v) { return !val(v).labels && pred(v); };
    if (forced >= 0) return ok(forced) ? forced : -1;
    std::vector<int> c;
    for (int v = 0; v < static_cast<int>(p_.values.size()); ++v)
      if (ok(v)) c.push_back(v);
    if (c.empty()) return -1;
    if (c.size() > 3 && chance(0.6)) return c[c.size() - 1 - between(0, 2)];
    return c[between(0, static_cast<int64_t>(c.size()) - 1)];
  }

  // An axis in [0, rank) as given to a routine: negative half of the time.
  int64_t axis_repr(int64_t axis, int64_t r) { return chance(0.4) ? axis - r : axis; }

  double signed_scalar() {  // +-[0.5, 2] in steps of 0.25
    const double s = static_cast<double>(between(2, 8)) * 0.25;
    return chance(0.5) ? s : -s;
  }

  static double sq_bound(double b) { return 1 + b * b; }

  // The optional bias of conv2d and linear, `features` elements (-1 for none): an existing value
  // or a new leaf (a parameter with probability `param_chance`).
  int optional_bias(int64_t features, double param_chance) {
    if (!chance(0.6)) return -1;
    int bias = pick([&](int v) { return shape(v) == Dims{features}; });
    if (bias < 0 || chance(0.5)) {
      const int leaf = new_leaf_of({features}, chance(param_chance), 0.85);
      if (leaf >= 0) bias = leaf;
    }
    return bias;
  }

  // The inputs of a product of x and w summing `terms` products per output, plus bias when >= 0,
  // each squashed to keep values bounded, and a bound of the result.
  std::pair<std::vector<int>, double> product_inputs(int x, int w, int bias, int64_t terms) {
    x = squash(x, 3);
    w = squash(w, 3);
    std::vector<int> ins = {x, w};
    double bound = static_cast<double>(terms) * val(x).bound * val(w).bound;
    if (bias >= 0) {
      bias = squash(bias, 1e3);
      ins.push_back(bias);
      bound += val(bias).bound;
    }
    return {ins, bound};
  }

  bool try_emit(OpKind op, int forced) {
    auto any = [](int) { return true; };
    auto ranked = [this](int lo, int hi) {
      return [this, lo, hi](int v) { return rank(v) >= lo && rank(v) <= hi; };
    };
    switch (op) {
      case OpKind::Add:
      case OpKind::Sub:
      case OpKind::Mul:
      case OpKind::DivSigmoid:
      case OpKind::DivExp:
        return binary(op, forced);
      case OpKind::AddScalar:
      case OpKind::SubScalar:
      case OpKind::RsubScalar:
      case OpKind::MulScalar:
      case OpKind::DivScalar:
      case OpKind::RdivScalar: {
        int x = pick(any, forced);
        if (x < 0) return false;
        x = squash(x, 1e3);
        const double s = signed_scalar(), b = val(x).bound;
        const double bound =
            op == OpKind::AddScalar || op == OpKind::SubScalar || op == OpKind::RsubScalar
                ? b + std::abs(s)
            : op == OpKind::MulScalar ? b * std::abs(s)
            : op == OpKind::DivScalar ? b / std::abs(s)
                                      : std::abs(s);
        emit(op, {x}, shape(x), bound, {}, s);
        return true;
      }
      case OpKind::Neg:
      case OpKind::Relu:
      case OpKind::LeakyRelu:
      case OpKind::ExpTanh:
      case OpKind::Sigmoid:
      case OpKind::Tanh:
      case OpKind::Gelu:
      case OpKind::LogSq:
      case OpKind::SqrtSq:
      case OpKind::PowSq: {
        int x = pick(any, forced);
        if (x < 0) return false;
        x = squash(x, op == OpKind::PowSq ? 10 : 1e3);
        const double b = val(x).bound;
        double bound = b, scalar = 0;
        if (op == OpKind::LeakyRelu) scalar = chance(0.5) ? 0.01 : 0.2;
        if (op == OpKind::Gelu) scalar = chance(0.5) ? 0 : 1;  // |gelu(x)| <= |x| either way
        if (op == OpKind::ExpTanh) bound = std::exp(1.0);
        if (op == OpKind::Sigmoid || op == OpKind::Tanh) bound = 1;
        if (op == OpKind::LogSq) bound = std::log(sq_bound(b));
        if (op == OpKind::SqrtSq) bound = std::sqrt(sq_bound(b));
        if (op == OpKind::PowSq) {
          static const double kExponents[] = {0.5, 1.5, 2, 3, -0.5, -1, -1.5};
          scalar = kExponents[between(0, 6)];
          bound = scalar > 0 ? std::pow(sq_bound(b), scalar) : 1;
        }
        emit(op, {x}, shape(x), bound, {}, scalar);
        return true;
      }
      case OpKind::Softmax:
      case OpKind::LogSoftmax: {
        int x = pick(ranked(1, 4), forced);
        if (x < 0) return false;
        x = squash(x, 1e3);
        const int64_t r = rank(x), axis = between(0, r - 1);
        const double bound = op == OpKind::Softmax
                                 ? 1
                                 : 2 * val(x).bound + std::log(static_cast<double>(shape(x)[axis]));
        emit(op, {x}, shape(x), bound, {axis_repr(axis, r)});
        return true;
      }
      case OpKind::Matmul:
        return matmul(forced);
      case OpKind::Linear:
        return linear(forced);
      case OpKind::Sum:
      case OpKind::Mean:
      case OpKind::Max:
        return reduce(op, forced);
      case OpKind::Reshape:
        return reshape(forced);
      case OpKind::Flatten: {
        int x = pick(any, forced);
        if (x < 0) return false;
        const Dims s = shape(x);
        const int64_t r = rank_of(s);
        if (r == 0) {
          emit(op, {x}, {1}, val(x).bound, {0, -1});
          return true;
        }
        const int64_t a = between(0, r - 1), e = between(a, r - 1);
        Dims out(s.begin(), s.begin() + a);
        int64_t merged = 1;
        for (int64_t i = a; i <= e; ++i) merged *= s[i];
        out.push_back(merged);
        out.insert(out.end(), s.begin() + e + 1, s.end());
        emit(op, {x}, out, val(x).bound, {axis_repr(a, r), axis_repr(e, r)});
        return true;
      }
      case OpKind::Transpose: {
        const int x = pick(ranked(2, 4), forced);
        if (x < 0) return false;
        Dims s = shape(x);
        const int64_t r = rank_of(s);
        if (chance(0.2)) {
          std::swap(s[r - 2], s[r - 1]);
          emit(op, {x}, s, val(x).bound, {-2, -1}, 0, true);
          return true;
        }
        const int64_t d0 = between(0, r - 1), d1 = chance(0.1) ? d0 : between(0, r - 1);
        std::swap(s[d0], s[d1]);
        emit(op, {x}, s, val(x).bound, {axis_repr(d0, r), axis_repr(d1, r)});
        return true;
      }
      case OpKind::Permute: {
        const int x = pick(ranked(1, 4), forced);
        if (x < 0) return false;
        const Dims s = shape(x);
        const int64_t r = rank_of(s);
        std::vector<int64_t> perm(r);
        for (int64_t i = 0; i < r; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng_);
        Dims out(r);
        std::vector<int64_t> repr(r);
        for (int64_t i = 0; i < r; ++i) {
          out[i] = s[perm[i]];
          repr[i] = axis_repr(perm[i], r);
        }
        emit(op, {x}, out, val(x).bound, repr);
        return true;
      }
      case OpKind::BroadcastTo: {
        const int x = pick(any, forced);
        if (x < 0) return false;
        const Dims s = shape(x);
        Dims out;
        for (int64_t i = 0, lead = between(0, 4 - rank_of(s)); i < lead; ++i)
          out.push_back(between(1, 4));
        for (int64_t d : s) out.push_back(d == 1 && chance(0.6) ? between(2, 4) : d);
        if (numel_of(out) > kMaxNumel) return false;
        emit(op, {x}, out, val(x).bound, out);
        return true;
      }
      case OpKind::Concat:
        return concat(forced);
      case OpKind::Slice: {
        const int x = pick(ranked(1, 4), forced);
        if (x < 0) return false;
        Dims s = shape(x);
        const int64_t r = rank_of(s), axis = between(0, r - 1), n = s[axis];
        const int64_t start = between(0, n - 1), stop = between(start + 1, n);
        static const int64_t kSteps[] = {1, 1, 2, 3};
        const int64_t step = kSteps[between(0, 3)];
        s[axis] = (stop - start - 1) / step + 1;
        const int64_t start_repr = chance(0.3) ? start - n : start;
        const int64_t stop_repr =
            stop == n ? (chance(0.3) ? n + between(1, 5) : n) : (chance(0.3) ? stop - n : stop);
        emit(op, {x}, s, val(x).bound, {axis_repr(axis, r), start_repr, stop_repr, step});
        return true;
      }
      case OpKind::Mse: {
        int a = pick(any, forced);
        if (a < 0) return false;
        const Dims s = shape(a);
        int b = pick([&](int v) { return v != a && shape(v) == s; });
        if (b < 0 && chance(0.7)) b = new_leaf_of(s, false, 0.3);
        if (b < 0) b = a;
        if (chance(0.5)) std::swap(a, b);
        a = squash(a, 30);
        b = squash(b, 30);
        const double bound = std::pow(val(a).bound + val(b).bound, 2);
        emit(op, {a, b}, {}, bound);
        return true;
      }
      case OpKind::CrossEntropy:
        return cross_entropy(forced);
      case OpKind::LayerNorm:
        return layer_norm(forced);
      case OpKind::MaskedFill:
        return masked_fill(forced);
      case OpKind::Conv2d:
        return conv2d(forced);
      case OpKind::MaxPool2d:
      case OpKind::AvgPool2d:
        return pool2d(op, forced);
      case OpKind::GlobalAvgPool2d: {
        const int x = image_input(forced);
        if (x < 0) return false;
        emit(op, {x}, {shape(x)[0], shape(x)[1]}, val(x).bound);
        return true;
      }
      case OpKind::BatchNorm:
        return batch_norm(forced);
      case OpKind::Dropout: {
        int x = pick(any, forced);
        if (x < 0) return false;
        x = squash(x, 1e3);
        static const double kRatios[] = {0, 0.1, 0.25, 0.5, 0.5, 0.8};
        const double ratio = kRatios[between(0, 5)];
        const bool training = chance(0.9);
        emit(op, {x}, shape(x), training ? val(x).bound / (1 - ratio) : val(x).bound, {}, ratio,
             training);
        return true;
      }
    }
    return false;
  }

  // A value of rank 4 to read as [N,C,H,W]: `forced` (when it has rank 4), an existing one, or,
  // when there is none, no step is forced and an argument is left, often a new argument.
  int image_input(int forced) {
    const int x = pick([this](int v) { return rank(v) == 4; }, forced);
    if (x >= 0 || forced >= 0 || !can_add_leaf(false) || !chance(0.6)) return x;
    return new_leaf(image_dims(), false, chance(0.6));
  }

  struct Window {
    int64_t stride, padding, dilation, out;
  };

  // Stride, padding (at most 2) and dilation of a conv2d with a kernel of k over n, or nullopt
  // when the kernel does not fit.
  std::optional<Window> conv_window(int64_t n, int64_t k) {
    static const int64_t kStrides[] = {1, 1, 2, 3};
    int64_t dilation = k > 1 && chance(0.3) ? 2 : 1;
    if (dilation * (k - 1) + 1 > n + 4) dilation = 1;
    const int64_t extent = dilation * (k - 1) + 1;
    const int64_t min_pad = std::max<int64_t>(0, (extent - n + 1) / 2);
    if (min_pad > 2) return std::nullopt;
    const int64_t pad = chance(0.5) ? min_pad : between(min_pad, 2);
    const int64_t stride = kStrides[between(0, 3)];
    return Window{stride, pad, dilation, (n + 2 * pad - extent) / stride + 1};
  }

  // conv2d(x [N,C,H,W], w [O,C/groups,kh,kw], bias [O]?): w a new leaf (mostly a parameter) or
  // an existing value that fits, bias an existing value or a new leaf.
  bool conv2d(int forced) {
    int x = image_input(forced);
    if (x < 0) return false;
    const Dims sx = shape(x);
    const int64_t c = sx[1];
    int w = -1;
    Dims sw;
    if (chance(0.15)) {
      w = pick([&](int v) {
        const Dims s = shape(v);
        return v != x && s.size() == 4 && c % s[1] == 0 && s[0] % (c / s[1]) == 0 && s[2] <= 5 &&
               s[3] <= 5;
      });
      if (w >= 0) sw = shape(w);
    }
    if (w < 0) {
      std::vector<int64_t> divisors;
      for (int64_t g = 1; g <= c; ++g)
        if (c % g == 0) divisors.push_back(g);
      const int64_t groups =
          chance(0.35) ? divisors[between(0, static_cast<int64_t>(divisors.size()) - 1)] : 1;
      const int64_t kh = between(1, 3), kw = chance(0.6) ? kh : between(1, 3);
      sw = {groups * between(1, std::max<int64_t>(1, 6 / groups)), c / groups, kh, kw};
    }
    const int64_t groups = c / sw[1], taps = sw[1] * sw[2] * sw[3];
    const std::optional<Window> wh = conv_window(sx[2], sw[2]), ww = conv_window(sx[3], sw[3]);
    if (!wh || !ww) return false;
    const Dims out = {sx[0], sw[0], wh->out, ww->out};
    if (numel_of(out) > kMaxNumel || numel_of(out) * taps > kMaxConvWork) return false;
    if (w < 0) w = new_leaf_of(sw, chance(0.9), 0.85);
    if (w < 0) return false;
    const int bias = optional_bias(sw[0], 0.85);
    const auto [ins, bound] = product_inputs(x, w, bias, taps);
    emit(OpKind::Conv2d, ins, out, bound,
         {wh->stride, ww->stride, wh->padding, ww->padding, wh->dilation, ww->dilation, groups}, 0,
         bias >= 0);
    return true;
  }

  // max_pool2d or avg_pool2d with a kernel of 1 to 3 (within x), the stride given or the
  // default, padding at most half the kernel.
  bool pool2d(OpKind op, int forced) {
    const int x = image_input(forced);
    if (x < 0) return false;
    const Dims sx = shape(x);
    const int64_t kh = between(1, std::min<int64_t>(3, sx[2]));
    const int64_t kw = chance(0.5) && kh <= sx[3] ? kh : between(1, std::min<int64_t>(3, sx[3]));
    const bool strided = chance(0.5);
    const int64_t sh = strided ? between(1, 3) : kh;
    const int64_t sw = strided ? (chance(0.5) ? sh : between(1, 3)) : kw;
    const bool padded = chance(0.4);
    const int64_t ph = padded ? between(0, kh / 2) : 0, pw = padded ? between(0, kw / 2) : 0;
    const Dims out = {sx[0], sx[1], (sx[2] + 2 * ph - kh) / sh + 1, (sx[3] + 2 * pw - kw) / sw + 1};
    if (numel_of(out) > kMaxNumel) return false;
    std::vector<int64_t> ints = {kh, kw, sh, sw, ph, pw};
    if (op == OpKind::AvgPool2d) ints.push_back(chance(0.5) ? 1 : 0);
    emit(op, {x}, out, val(x).bound, ints, 0, strided);
    return true;
  }

  // batch_norm(x [N,C] or [N,C,H,W], running statistics?, gamma and beta?), training or eval.
  // The running statistics are a new pair or one already used by another batch_norm (a module
  // applied twice, or eval after training, in one call); eval needs them. Training needs two
  // values per channel at least, and does not update statistics an earlier eval step read (its
  // backward needs them unchanged, as in PyTorch).
  bool batch_norm(int forced) {
    const bool training = chance(0.7);
    int x = pick(
        [&](int v) {
          const Dims s = shape(v);
          return (s.size() == 2 || s.size() == 4) && (!training || numel_of(s) / s[1] >= 2);
        },
        forced);
    if (x < 0 && forced < 0 && can_add_leaf(false) && chance(0.6))
      x = new_leaf(image_dims(), false, chance(0.6));
    if (x < 0) return false;
    const int64_t c = shape(x)[1];
    int state = -1;
    if (!training || chance(0.75)) {
      std::vector<int> fit;
      for (size_t i = 0; i < p_.states.size(); ++i)
        if (p_.states[i] == c && !(training && eval_read_[i])) fit.push_back(static_cast<int>(i));
      const bool room = static_cast<int>(p_.states.size()) < kMaxStates;
      if (!fit.empty() && (!room || chance(0.4))) {
        state = fit[between(0, static_cast<int64_t>(fit.size()) - 1)];
      } else if (room) {
        state = static_cast<int>(p_.states.size());
        p_.states.push_back(c);
        eval_read_.push_back(false);
      }
      if (state < 0 && !training) return false;
    }
    int gamma = -1, beta = -1;
    if (chance(0.6)) {
      const auto channels = [&] {
        int v = chance(0.25) ? pick([&](int u) { return shape(u) == Dims{c}; }) : -1;
        if (v < 0) v = new_leaf_of({c}, chance(0.9), 0.85);
        return v;
      };
      gamma = channels();
      beta = channels();
      if (gamma < 0 || beta < 0) gamma = beta = -1;
    }
    // Training inputs stay within 30, so the running means do too.
    x = squash(x, training ? 30 : 1e3);
    std::vector<int> ins = {x};
    double scale = 1, shift = 0;
    if (gamma >= 0) {
      gamma = squash(gamma, 30);
      beta = squash(beta, 1e3);
      ins.push_back(gamma);
      ins.push_back(beta);
      scale = val(gamma).bound;
      shift = val(beta).bound;
    }
    // Training: |x - mean| / sqrt(var) is at most sqrt(count). Eval: the running variances
    // mostly stay above 0.02 over the calls of a test (momentum at most 0.3), so 1 / sqrt(var)
    // is below 8 (a rough bound, as the others).
    const double count = static_cast<double>(numel_of(shape(x)) / c);
    const double norm = training ? std::sqrt(count) : (val(x).bound + 31) * 8;
    static const double kMomenta[] = {0.1, 0.1, 0.3, 0};
    const double momentum = kMomenta[between(0, 3)], eps = chance(0.7) ? 1e-5 : 1e-3;
    if (state >= 0 && !training) eval_read_[state] = true;
    emit(OpKind::BatchNorm, ins, shape(x), norm * scale + shift,
         {state, training ? 1 : 0, gamma >= 0 ? 1 : 0}, momentum);
    p_.steps.back().scalar2 = eps;
    return true;
  }

  // x (+ - * /) y, y broadcast-compatible with x: an existing value, a new leaf of a variant of
  // x's shape, or a keepdims sum of x.
  bool binary(OpKind op, int forced) {
    int a = pick([](int) { return true; }, forced);
    if (a < 0) return false;
    const Dims sa = shape(a);
    Dims out;
    int b = pick([&](int v) {
      Dims o;
      return v != a && broadcast_dims(sa, shape(v), o) && numel_of(o) <= kMaxNumel;
    });
    if (b < 0 || chance(0.25)) {
      const int64_t what = between(0, 2);
      if (what == 0 && rank_of(sa) > 0) {
        b = new_leaf_of(variant(sa), chance(0.5), 0.6);
      } else if (what == 1 && rank_of(sa) > 0) {
        std::vector<int64_t> axes;
        Dims kept = sa;
        for (int64_t i = 0; i < rank_of(sa); ++i)
          if (chance(0.5)) {
            axes.push_back(i);
            kept[i] = 1;
          }
        if (!axes.empty())
          b = emit(OpKind::Sum, {a}, kept, val(a).bound * numel_of(sa), axes, 0, true);
      }
      if (b < 0) b = a;
    }
    if (chance(0.5)) std::swap(a, b);
    if (op == OpKind::Mul) {
      a = squash(a, 30);
      b = squash(b, 30);
    } else {
      a = squash(a, 1e3);
      b = squash(b, 1e3);
    }
    broadcast_dims(shape(a), shape(b), out);
    const double ba = val(a).bound, bb = val(b).bound;
    const double bound = op == OpKind::Add || op == OpKind::Sub ? ba + bb
                         : op == OpKind::Mul                    ? ba * bb
                         : op == OpKind::DivSigmoid             ? ba / 1.5
                                                                : ba * std::exp(1.0);
    emit(op, {a, b}, out, bound);
    return true;
  }

  // [M,K]x[K,N], [B,M,K]x[B,K,N], [B,M,K]x[K,N]; the right operand an existing value, a new
  // leaf, or the left one transposed.
  // matmul(a [..., M, K], b [..., K, N]), the batch dimensions (up to two) broadcast.
  bool matmul(int forced) {
    int a = pick([&](int v) { return rank(v) >= 2; }, forced);
    if (a < 0) return false;
    const Dims sa = shape(a);
    const int64_t k = sa.back();
    const Dims batch_a(sa.begin(), sa.end() - 2);
    auto batches_fit = [](const Dims& x, const Dims& y) {
      Dims out;
      return broadcast_dims(Dims(x.begin(), x.end() - 2), Dims(y.begin(), y.end() - 2), out);
    };
    int b = pick([&](int v) {
      const Dims s = shape(v);
      return s.size() >= 2 && s[s.size() - 2] == k && batches_fit(sa, s);
    });
    bool transposed_self = false;
    if (b < 0 || chance(0.3)) {
      const int64_t n = between(1, 6);
      int leaf = -1;
      if (chance(0.6)) {
        // b's batch: none, a's, or a's with some dimensions 1 (broadcast), or a new leading one.
        Dims s;
        if (!batch_a.empty() && chance(0.6)) {
          s = batch_a;
          for (int64_t& d : s)
            if (chance(0.3)) d = 1;
        } else if (batch_a.size() < 2 && chance(0.2)) {
          s.push_back(between(2, 3));
          s.insert(s.end(), batch_a.begin(), batch_a.end());
        }
        s.push_back(k);
        s.push_back(n);
        leaf = new_leaf_of(s, chance(0.6), 0.8);
      }
      if (leaf >= 0) {
        b = leaf;
      } else if (b < 0) {
        Dims st = sa;
        std::swap(st[st.size() - 2], st[st.size() - 1]);
        b = emit(OpKind::Transpose, {a}, st, val(a).bound, {-2, -1}, 0, true);
        transposed_self = true;
      }
    }
    if (transposed_self && chance(0.5)) std::swap(a, b);  // a^T a instead of a a^T
    const Dims s0 = shape(a), s1 = shape(b);
    Dims out;
    if (!broadcast_dims(Dims(s0.begin(), s0.end() - 2), Dims(s1.begin(), s1.end() - 2), out))
      return false;
    out.push_back(s0[s0.size() - 2]);
    out.push_back(s1.back());
    if (numel_of(out) > kMaxNumel) return false;
    const auto [ins, bound] = product_inputs(a, b, -1, s0.back());
    emit(OpKind::Matmul, ins, out, bound);
    return true;
  }

  // layer_norm(x) over its last one or two dimensions, with gamma and beta each an existing
  // value of that shape, a new leaf, or none.
  bool layer_norm(int forced) {
    int x = pick([&](int v) { return rank(v) >= 1; }, forced);
    if (x < 0) return false;
    x = squash(x, 1e3);
    const Dims sx = shape(x);
    const int64_t k = rank_of(sx) >= 2 && chance(0.3) ? 2 : 1;
    const Dims normalized(sx.end() - k, sx.end());
    std::vector<int> ins = {x};
    int64_t affine = 0;
    double bound = std::sqrt(static_cast<double>(numel_of(normalized)));
    for (int64_t bit : {1, 2}) {
      if (!chance(0.6)) continue;
      int p = pick([&](int v) { return v != x && shape(v) == normalized; });
      if (p < 0 || chance(0.5)) {
        const int leaf = new_leaf_of(normalized, chance(0.7), 0.85);
        if (leaf >= 0) p = leaf;
      }
      if (p < 0) continue;
      p = squash(p, 10);
      affine |= bit;
      ins.push_back(p);
      bound = bit == 1 ? bound * val(p).bound : bound + val(p).bound;
    }
    emit(OpKind::LayerNorm, ins, sx, bound, {k, affine}, chance(0.5) ? 1e-5 : 0.1);
    return true;
  }

  // masked_fill(x, m > 0, s) with m an existing value that broadcasts to x (often x itself).
  bool masked_fill(int forced) {
    int x = pick([](int) { return true; }, forced);
    if (x < 0) return false;
    x = squash(x, 1e3);
    const Dims sx = shape(x);
    int m = pick([&](int v) {
      Dims out;
      return v != x && rank(v) <= rank_of(sx) && broadcast_dims(shape(v), sx, out) && out == sx;
    });
    if (m < 0 || chance(0.3)) m = x;
    const double s = signed_scalar();
    const int out =
        emit(OpKind::MaskedFill, {x, m}, sx, std::max(val(x).bound, std::abs(s)), {}, s);
    p_.values[out].requires_grad = val(x).requires_grad;  // the mask carries no gradient
    return true;
  }

  // linear(x, w[out, in], bias[out]?) with w and bias existing values or new leaves.
  bool linear(int forced) {
    int x = pick([&](int v) { return rank(v) >= 1; }, forced);
    if (x < 0) return false;
    const Dims sx = shape(x);
    const int64_t in = sx.back();
    int w = pick([&](int v) { return rank(v) == 2 && shape(v)[1] == in; });
    if (w < 0 || chance(0.5)) {
      const int leaf = new_leaf_of({between(1, 6), in}, chance(0.8), 0.85);
      if (leaf >= 0) w = leaf;
    }
    if (w < 0) return false;
    const int64_t out_features = shape(w)[0];
    Dims out(sx.begin(), sx.end() - 1);
    out.push_back(out_features);
    if (numel_of(out) > kMaxNumel) return false;
    const int bias = optional_bias(out_features, 0.8);
    const auto [ins, bound] = product_inputs(x, w, bias, in);
    emit(OpKind::Linear, ins, out, bound, {}, 0, bias >= 0);
    return true;
  }

  bool reduce(OpKind op, int forced) {
    int x = pick([](int) { return true; }, forced);
    if (x < 0) return false;
    if (op == OpKind::Sum) x = squash(x, 1e3);
    const Dims s = shape(x);
    const int64_t r = rank_of(s);
    std::vector<int64_t> axes;
    for (int64_t i = 0; i < r; ++i)
      if (chance(0.5)) axes.push_back(i);
    if (axes.empty() && r > 0 && chance(0.5)) axes.push_back(between(0, r - 1));
    std::shuffle(axes.begin(), axes.end(), rng_);
    const bool keepdims = chance(0.5);
    Dims out;
    int64_t count = 1;
    for (int64_t i = 0; i < r; ++i) {
      const bool reduced = axes.empty() || std::find(axes.begin(), axes.end(), i) != axes.end();
      if (reduced) count *= s[i];
      if (!reduced || keepdims) out.push_back(reduced ? 1 : s[i]);
    }
    for (int64_t& a : axes) a = axis_repr(a, r);
    const double b = val(x).bound;
    emit(op, {x}, out, op == OpKind::Sum ? b * static_cast<double>(count) : b, axes, 0, keepdims);
    return true;
  }

  bool reshape(int forced) {
    const int x = pick([](int) { return true; }, forced);
    if (x < 0) return false;
    int64_t n = numel_of(shape(x));
    const int64_t r = between(1, 4);
    Dims out(r, 1);
    for (int64_t f = 2; n > 1;) {  // each prime factor to a random dimension
      if (n % f == 0) {
        out[between(0, r - 1)] *= f;
        n /= f;
      } else {
        ++f;
      }
    }
    std::vector<int64_t> repr = out;
    if (chance(0.3)) repr[between(0, r - 1)] = -1;
    emit(OpKind::Reshape, {x}, out, val(x).bound, repr);
    return true;
  }

  bool concat(int forced) {
    const int x = pick([&](int v) { return rank(v) >= 1; }, forced);
    if (x < 0) return false;
    const Dims s = shape(x);
    const int64_t r = rank_of(s), axis = between(0, r - 1);
    auto fits = [&](int v) {
      const Dims t = shape(v);
      if (t.size() != s.size()) return false;
      for (int64_t d = 0; d < r; ++d)
        if (d != axis && t[d] != s[d]) return false;
      return true;
    };
    std::vector<int> ins = {x};
    for (int64_t i = 0, more = between(1, 2); i < more; ++i) {
      int y = pick(fits);
      if (y < 0 || chance(0.2)) y = x;
      ins.push_back(y);
    }
    std::shuffle(ins.begin(), ins.end(), rng_);
    Dims out = s;
    out[axis] = 0;
    double bound = 0;
    for (int v : ins) {
      out[axis] += shape(v)[axis];
      bound = std::max(bound, val(v).bound);
    }
    if (numel_of(out) > kMaxNumel) return false;
    emit(OpKind::Concat, ins, out, bound, {axis_repr(axis, r)});
    return true;
  }

  // softmax_cross_entropy(logits [N,C], labels [N]): the labels are one int argument, made on
  // first use; logits of another rank are reshaped to 2-D first.
  bool cross_entropy(int forced) {
    int x = pick([](int) { return true; }, forced);
    if (x < 0) return false;
    const Dims s = shape(x);
    Dims logits = s;
    if (s.size() == 0) logits = {1, 1};
    if (s.size() == 1) logits = {1, s[0]};
    if (s.size() > 2) logits = {numel_of(s) / s.back(), s.back()};
    const Leaf* labels = nullptr;
    for (const Leaf& l : p_.leaves)
      if (val(l.value).labels) labels = &l;
    if (labels != nullptr &&
        (val(labels->value).shape[0] != logits[0] || labels->classes > logits[1]))
      return false;
    int label_value = labels ? labels->value : -1;
    if (label_value < 0) {
      label_value = add_value({logits[0]}, false, 0);
      Leaf l;
      l.value = label_value;
      l.index = p_.num_args++;
      l.label_dtype = chance(0.5) ? DType::Int64 : DType::Int32;
      l.classes = logits[1];
      l.ignores_some = chance(0.3);
      p_.values[label_value].labels = true;
      p_.values[label_value].leaf = static_cast<int>(p_.leaves.size());
      p_.leaves.push_back(l);
    }
    x = squash(x, 1e3);
    if (logits != s) {
      std::vector<int64_t> repr = logits;
      if (chance(0.5)) repr[0] = -1;
      x = emit(OpKind::Reshape, {x}, logits, val(x).bound, repr);
    }
    emit(OpKind::CrossEntropy, {x, label_value}, {},
         2 * val(x).bound + std::log(static_cast<double>(logits[1])));
    return true;
  }

  std::mt19937_64 rng_;
  Program p_;
  std::vector<bool> eval_read_;  // by state: read by an eval batch_norm step
};

}  // namespace encore::random_program
