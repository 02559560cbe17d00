// dist::DataParallel: a module's gradients averaged across the ranks in buckets, each bucket's
// all-reduce started by the post-accumulate hook of its last gradient and waited for by a
// callback at the end of the backward pass (runtime/autograd.h). Everything it does to tensors is
// dispatched ops, so a static whole step records it and replays it without the hooks.
//
// A gradient is final after as many accumulations as the backward makes into it: one for most
// parameters, two for a weight used twice (tied), none for a parameter the loss does not use. The
// first backward learns these counts (as PyTorch DDP's static_graph does): it all-reduces every
// bucket at its end, checks that every rank counted the same, and drops the unused parameters
// from the buckets. Every later backward must count the same; a parameter that does not is an
// Error naming it.
#include <cstdint>
#include <string_view>

#include "api/src/routine.h"
#include "dist/world.h"
#include "encore/dist.h"
#include "runtime/autograd.h"
#include "runtime/dispatcher.h"

namespace encore::dist {
namespace {

// Per parameter or buffer: a name hash, requires-grad, dtype, element count, rank and up to 8
// dimensions.
constexpr int kDescribed = 13;

int64_t name_hash(std::string_view name) {  // FNV-1a, the same in every process
  uint64_t h = 1469598103934665603ull;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

// Max over ranks of `values` and of their negations, i.e. max and -min elementwise.
std::vector<int64_t> max_and_negated_min(const std::vector<int64_t>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor both = Tensor::empty({2 * n}, DType::Int64);
  int64_t* p = both.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    p[i] = values[static_cast<size_t>(i)];
    p[n + i] = -values[static_cast<size_t>(i)];
  }
  all_reduce(both, ReduceOp::Max);
  return both.to_vector<int64_t>();
}

}  // namespace

struct DataParallel::State {
  struct Param {
    std::string name;
    Tensor tensor;
    int bucket = -1;     // -1: unused, in no bucket
    int64_t offset = 0;  // in the bucket, in elements
    int uses = -1;       // accumulations per backward, learned from the first (-1: not yet)
    int seen = 0;        // accumulations in this pass
  };
  struct Bucket {
    std::vector<int> params;
    int64_t numel = 0;
    int pending = 0;  // gradients this pass still waits for
    Tensor buffer, handle;
  };

  nn::Module* module = nullptr;
  std::vector<Param> params;  // that require grad, last first
  std::vector<Bucket> buckets;
  size_t bucket_bytes = 0;
  bool learned = false;  // the first backward has counted each parameter's uses
  std::vector<uint64_t> hooks;
  uint64_t pass = 0;          // the backward pass the fields below belong to
  std::vector<int> launched;  // buckets in the order their all-reduces started

  // Checks that every rank has the same tensors as `named` (count, names, requires-grad, dtypes,
  // shapes); `what` is "parameter" or "buffer".
  void check_agreement(const std::vector<std::pair<std::string, Tensor>>& named,
                       const char* what) const;
  // Buckets of the parameters in use (all of them before the first backward).
  void make_buckets();
  void on_gradient(int p);
  void launch(int b);
  // The end of the first backward: every rank's counts agree, the unused parameters leave the
  // buckets, and every bucket starts its all-reduce.
  void learn();
  void finish();
  // Waits for the buckets in flight and drops them, then throws Error(message): the ranks' requests
  // complete before the error leaves, so the next step starts with none in flight.
  [[noreturn]] void abandon(const std::string& message);
};

void DataParallel::State::check_agreement(const std::vector<std::pair<std::string, Tensor>>& named,
                                          const char* what) const {
  const int64_t count = static_cast<int64_t>(named.size());
  const std::vector<int64_t> counts = max_and_negated_min({count});
  if (counts[0] != -counts[1])
    fail("DataParallel: the ranks' modules have different numbers of ", what, "s (", -counts[1],
         " to ", counts[0], "); ", rank_name(), " has ", count,
         count > 0 ? cat(", the last '", named.back().first, "' ", named.back().second.str()) : "");
  std::vector<int64_t> described(static_cast<size_t>(count * kDescribed), -1);
  for (int64_t i = 0; i < count; ++i) {
    const Tensor& t = named[static_cast<size_t>(i)].second;
    int64_t* d = described.data() + i * kDescribed;
    d[0] = name_hash(named[static_cast<size_t>(i)].first);
    d[1] = t.requires_grad();
    d[2] = static_cast<int64_t>(t.dtype());
    d[3] = t.numel();
    d[4] = t.rank();
    for (int a = 0; a < t.rank() && a < kDescribed - 5; ++a) d[5 + a] = t.shape()[a];
  }
  const std::vector<int64_t> seen = max_and_negated_min(described);
  const size_t n = described.size();
  for (size_t k = 0; k < n; ++k)
    if (seen[k] != -seen[n + k]) {
      const auto& [name, t] = named[k / kDescribed];
      fail("DataParallel: ", what, " '", name, "' differs across ranks (in its ",
           k % kDescribed == 0   ? "name"
           : k % kDescribed == 1 ? "requires_grad"
                                 : "shape or dtype",
           "): on ", rank_name(), " it is ", t.str(), "; every rank must build the same module");
    }
}

void DataParallel::State::make_buckets() {
  buckets.clear();
  // Backward produces the last parameters' gradients first: they fill the first bucket.
  for (int p = 0; p < static_cast<int>(params.size()); ++p) {
    params[static_cast<size_t>(p)].bucket = -1;
    if (params[static_cast<size_t>(p)].uses == 0) continue;
    const Tensor& t = params[static_cast<size_t>(p)].tensor;
    bool fits = !buckets.empty();
    if (fits) {
      const Tensor& first = params[static_cast<size_t>(buckets.back().params[0])].tensor;
      fits = first.dtype() == t.dtype() && first.device() == t.device() &&
             (buckets.back().numel + t.numel()) * static_cast<int64_t>(itemsize(t.dtype())) <=
                 static_cast<int64_t>(bucket_bytes);
    }
    if (!fits) buckets.emplace_back();
    Bucket& b = buckets.back();
    params[static_cast<size_t>(p)].bucket = static_cast<int>(buckets.size()) - 1;
    params[static_cast<size_t>(p)].offset = b.numel;
    b.params.push_back(p);
    b.numel += t.numel();
  }
}

void DataParallel::State::on_gradient(int p) {
  if (const uint64_t now = autograd::current_pass(); now != pass) {
    pass = now;
    for (Param& q : params) q.seen = 0;
    for (Bucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    launched.clear();
    autograd::queue_callback([this] { finish(); });
  }
  Param& param = params[static_cast<size_t>(p)];
  ++param.seen;
  if (!learned) return;  // the first backward all-reduces at its end
  if (param.seen > param.uses)
    abandon(cat("DataParallel: parameter '", param.name, "' got gradient ", param.seen,
                " in this backward; the first backward gave it ", param.uses,
                " (DataParallel learns from the first backward how often each parameter is used, "
                "and starts a bucket's all-reduce when its gradients are final): the step must "
                "use every parameter as often each time"));
  if (param.seen == param.uses && --buckets[static_cast<size_t>(param.bucket)].pending == 0)
    launch(param.bucket);
}

void DataParallel::State::launch(int b) {
  Bucket& bucket = buckets[static_cast<size_t>(b)];
  if (bucket.params.size() == 1) {
    // A bucket of one (a large parameter): its gradient is the buffer, no concatenation.
    bucket.buffer = params[static_cast<size_t>(bucket.params[0])].tensor.grad();
    bucket.handle = start_all_reduce(bucket.buffer);
    launched.push_back(b);
    return;
  }
  std::vector<Tensor> flat;
  flat.reserve(bucket.params.size());
  for (const int p : bucket.params) {
    const Tensor g = params[static_cast<size_t>(p)].tensor.grad();
    flat.push_back(F::reshape(g, {g.numel()}));
  }
  bucket.buffer = Tensor::empty({bucket.numel}, flat[0].dtype(), flat[0].device());
  dispatch(Op::Concat, std::span<const Tensor>(flat), std::span<Tensor>(&bucket.buffer, 1),
           AttrBlob::of(AxisAttrs{0}));
  bucket.handle = start_all_reduce(bucket.buffer);
  launched.push_back(b);
}

void DataParallel::State::abandon(const std::string& message) {
  for (const int b : launched) {
    Bucket& bucket = buckets[static_cast<size_t>(b)];
    wait_all_reduce(bucket.buffer, bucket.handle);
    bucket.buffer = Tensor();
    bucket.handle = Tensor();
  }
  launched.clear();
  throw Error(message);
}

void DataParallel::State::learn() {
  // A static function tracing this pass records all-reduces at its end, where later passes start
  // them during backward: it must trace again.
  if (Tracer* tracer = current_tracer())
    tracer->on_unrepeatable(
        "dist::DataParallel's first backward, which learns how often each parameter is used");
  std::vector<int64_t> counts;
  for (const Param& param : params) counts.push_back(param.seen);
  std::vector<int64_t> seen;
  {
    // A check of this first pass only: a static function tracing it does not replay it.
    TracerScope untraced(nullptr);
    seen = max_and_negated_min(counts);
  }
  const size_t n = counts.size();
  for (size_t k = 0; k < n; ++k)
    if (seen[k] != -seen[n + k])
      fail("DataParallel: parameter '", params[k].name, "' got ", counts[k],
           " gradients in the first backward on ", rank_name(), " and ", -seen[n + k], " to ",
           seen[k], " across the ranks; every rank must use each parameter as often");
  for (Param& param : params) param.uses = param.seen;
  learned = true;
  make_buckets();
  for (int b = 0; b < static_cast<int>(buckets.size()); ++b) launch(b);
}

void DataParallel::State::finish() {
  if (!learned) {
    learn();
  } else {
    for (const Param& param : params)
      if (param.seen != param.uses)
        abandon(cat("DataParallel: parameter '", param.name, "' got ", param.seen,
                    " gradients in this backward; the first backward gave it ", param.uses,
                    ": the step must use every parameter as often each time"));
  }
  const double scale = 1.0 / world_size();
  for (const int b : launched) {
    Bucket& bucket = buckets[static_cast<size_t>(b)];
    // Sum, then times 1/world_size (dividing is not the same bits for every world size): on the
    // cpu the wait scales in place, elsewhere a mul_scalar does.
    const bool host = bucket.buffer.device().type == DeviceType::CPU;
    dispatch(Op::AllReduceWait, {bucket.buffer, bucket.handle}, {},
             AttrBlob::of(CollectiveAttrs{0, ReduceOp::Sum, {}, host ? scale : 1}));
    const Tensor mean =
        host ? bucket.buffer
             : detail::call1(Op::MulScalar, {bucket.buffer}, bucket.buffer.shape(),
                             bucket.buffer.dtype(), AttrBlob::of(ScalarAttrs{scale}));
    if (bucket.params.size() == 1) {
      // The buffer is the gradient.
      if (!host) dispatch(Op::CopyInplace, {bucket.buffer, mean}, {});
    } else {
      for (const int p : bucket.params) {
        const Param& param = params[static_cast<size_t>(p)];
        const Tensor g = param.tensor.grad();
        const Tensor piece =
            detail::call1(Op::Slice, {mean}, {g.numel()}, g.dtype(),
                          AttrBlob::of(SliceAttrs{0, param.offset, param.offset + g.numel(), 1,
                                                  param.offset, param.offset + g.numel()}));
        dispatch(Op::CopyInplace, {g, F::reshape(piece, g.shape().dims())}, {});
      }
    }
    bucket.buffer = Tensor();
    bucket.handle = Tensor();
  }
  launched.clear();
}

DataParallel::DataParallel(nn::Module& module, DataParallelOptions options)
    : state_(std::make_unique<State>()) {
  ENCORE_CHECK(initialized(), "DataParallel: call dist::init() first");
  ENCORE_CHECK(options.bucket_bytes > 0, "DataParallel: bucket_bytes must be positive");
  state_->module = &module;
  const std::vector<std::pair<std::string, Tensor>> named = module.named_parameters();
  if (world_size() == 1) return;  // nothing to average
  state_->check_agreement(named, "parameter");
  // Buffers are copied byte for byte as parameters are: checked alike, before anything is copied.
  std::vector<std::pair<std::string, Tensor>> buffers;
  for (auto& [name, slot] : module.named_buffer_slots()) buffers.emplace_back(name, *slot);
  state_->check_agreement(buffers, "buffer");
  {
    NoGradGuard no_grad;
    for (auto [name, t] : named) broadcast(t, 0);
    for (auto [name, t] : buffers) broadcast(t, 0);
  }
  for (auto it = named.rbegin(); it != named.rend(); ++it)
    if (it->second.requires_grad()) state_->params.push_back({it->first, it->second});
  state_->bucket_bytes = options.bucket_bytes;
  state_->make_buckets();
  State* state = state_.get();
  for (int p = 0; p < static_cast<int>(state->params.size()); ++p)
    state->hooks.push_back(autograd::add_post_accumulate_grad_hook(
        state->params[static_cast<size_t>(p)].tensor,
        [state, p](const Tensor&) { state->on_gradient(p); }));
}

DataParallel::~DataParallel() {
  for (size_t p = 0; p < state_->hooks.size(); ++p)
    autograd::remove_post_accumulate_grad_hook(state_->params[p].tensor, state_->hooks[p]);
}

nn::Module& DataParallel::module() const {
  return *state_->module;
}

std::vector<std::vector<std::string>> DataParallel::buckets() const {
  std::vector<std::vector<std::string>> out;
  for (const State::Bucket& b : state_->buckets) {
    std::vector<std::string>& names = out.emplace_back();
    for (const int p : b.params) names.push_back(state_->params[static_cast<size_t>(p)].name);
  }
  return out;
}

}  // namespace encore::dist
