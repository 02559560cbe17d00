// Padded layouts (cpu plans): a stride-1 convolution copies each input image into a zero-padded
// scratch buffer before its products read it. Where a plan sees that a temporary [N, C, H, W] is
// written by one convolution that can write its output padded, and read only by convolutions
// that pad it one way (Conv2d and Conv2dGradWeight as x, with the same pads), it gives the
// buffer a block as large as the padded images and lets the writer lay its rows out there with
// zeros around them; the readers read it in place. The kernels own the layout and the choice of
// their path (runtime/padded_layout.h), so the values read, their order and the thread split are
// eager's: the bits are too.
#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/padded_layout.h"
#include "schedule/plan.h"

namespace encore::schedule {
namespace {

// What the steps do with one buffer, as far as padding it goes.
struct Use {
  int writer = -1;  // the step writing it (the last seen)
  int writes = 0;
  int reads = 0;
  bool paddable = true;  // every read so far reads it whole as a padded convolution input
  PaddedInput layout;    // the pads every reader wants, and the most elements per image any does
};

// Applies `f` to the convolution attributes of a Conv2d, Conv2dAct or Conv2dGradWeight step.
template <typename F>
void edit_conv_attrs(AttrBlob& blob, F f) {
  if (blob.holds<Conv2dActAttrs>()) {
    Conv2dActAttrs a = blob.as<Conv2dActAttrs>();
    f(a.conv);
    blob = AttrBlob::of(a);
  } else {
    Conv2dAttrs a = blob.as<Conv2dAttrs>();
    f(a);
    blob = AttrBlob::of(a);
  }
}

}  // namespace

void Plan::plan_padded_layouts() {
  const PaddedLayoutQueries& q = cpu_padded_layouts();
  if (q.reads_padded == nullptr || q.writes_padded == nullptr) return;
  std::vector<Buffer>& bufs = rec_->buffers;
  const int nb = static_cast<int>(bufs.size());
  std::vector<Use> use(nb);
  auto whole = [&](const Operand& o) { return o.nbytes() == bufs[o.buf].nbytes; };
  auto shapes = [](const auto& operands) {
    absl::InlinedVector<Shape, 3> out;
    for (const Operand& o : operands) out.push_back(o.shape);
    return out;
  };
  for (int t = 0; t < static_cast<int>(all_.size()); ++t) {
    const Step& s = all_[t];
    const auto in = shapes(s.in), out = shapes(s.out);
    for (size_t i = 0; i < s.in.size(); ++i) {
      const Operand& o = s.in[i];
      Use& u = use[o.buf];
      ++u.reads;
      PaddedInput p;
      u.paddable = u.paddable && i == 0 && !op_writes_input(s.op, i) && whole(o) &&
                   q.reads_padded(s.op, in, out, s.attrs, o.dtype, &p) &&
                   (u.reads == 1 || (p.pad_h == u.layout.pad_h && p.pad_w == u.layout.pad_w));
      if (u.paddable) u.layout = {p.pad_h, p.pad_w, std::max(u.layout.image, p.image)};
    }
    for (const Operand& o : s.out) {
      ++use[o.buf].writes;
      use[o.buf].writer = t;
    }
  }

  padded_.assign(nb, PaddedBuffer{});
  for (int b = 0; b < nb; ++b) {
    const Use& u = use[b];
    if (!u.paddable || u.reads == 0 || u.writes != 1 || bufs[b].kind != BufKind::Temp ||
        escape_[b] >= 0 || bufs[b].mutated)
      continue;
    Step& w = all_[u.writer];
    const Operand& y = w.out[0];
    if (w.out.size() != 1 || y.buf != b || !whole(y) ||
        u.layout.pad_h > std::numeric_limits<int16_t>::max() ||
        u.layout.pad_w > std::numeric_limits<int16_t>::max() ||
        !q.writes_padded(w.op, shapes(w.in), shapes(w.out), w.attrs, y.dtype))
      continue;
    // The readers see the writer's shape and dtype (not a reshaped view of the same bytes).
    bool same = true;
    for (const Step& s : all_)
      if (!s.in.empty() && s.in[0].buf == b)
        same = same && s.in[0].shape == y.shape && s.in[0].dtype == y.dtype;
    if (!same) continue;

    const PaddedInput& p = u.layout;
    PaddedBuffer& pb = padded_[b];
    pb = {p.pad_h, p.pad_w, y.shape[2] + 2 * p.pad_h, y.shape[3] + 2 * p.pad_w, p.image};
    bufs[b].nbytes = static_cast<size_t>(y.shape[0] * p.image) * itemsize(y.dtype);
    edit_conv_attrs(w.attrs, [&](Conv2dAttrs& a) {
      a.layout |= kConvPaddedOutput;
      a.out_padding[0] = static_cast<int16_t>(p.pad_h);
      a.out_padding[1] = static_cast<int16_t>(p.pad_w);
    });
    for (Step& s : all_)
      if (!s.in.empty() && s.in[0].buf == b)
        edit_conv_attrs(s.attrs, [](Conv2dAttrs& a) { a.layout |= kConvPaddedInput; });
  }
}

void append_padded_interior(std::vector<unsigned char>& bytes, const BufferView& y,
                            const Conv2dAttrs& a) {
  const int64_t n = y.shape[0], c = y.shape[1], h = y.shape[2], w = y.shape[3];
  const int64_t ph = a.out_padding[0], pw = a.out_padding[1], wp = w + 2 * pw;
  const int64_t image = padded_image_elements(c, h, w, ph, pw);
  const size_t item = itemsize(y.dtype), row = static_cast<size_t>(w) * item;
  size_t at = bytes.size();
  bytes.resize(at + static_cast<size_t>(y.numel()) * item);
  const unsigned char* src = static_cast<const unsigned char*>(y.data);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < c; ++s)
      for (int64_t r = 0; r < h; ++r, at += row)
        std::memcpy(bytes.data() + at,
                    src + ((i * image + (s * (h + 2 * ph) + ph + r) * wp + pw) * item), row);
}

}  // namespace encore::schedule
