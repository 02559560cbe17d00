// Elementwise fusion (cpu plans): runs of adjacent elementwise steps become one FusedElementwise
// step whose program (runtime/fused.h) keeps values only the run reads in scratch blocks.
#include <algorithm>
#include <memory>

#include "runtime/fused.h"
#include "schedule/plan.h"

namespace encore::schedule {

// Runs of adjacent elementwise steps of one phase, dtype and element count become one
// FusedElementwise step (cpu plans). Its kernel runs the steps block by block: a value only
// the run reads lives in a scratch block (never in the arena), and one the rest of the
// schedule reads (a saved activation, a result, a gradient) is an output of the fused step.
void Plan::fuse_elementwise() {
  const std::vector<Buffer>& bufs = rec_->buffers;
  const int n = static_cast<int>(all_.size());
  std::vector<int> last_read(bufs.size(), -1);
  for (int t = 0; t < n; ++t)
    for (const Operand& o : all_[t].in) last_read[o.buf] = t;
  // Whether `s` can join a run over `numel` elements of `dtype`.
  auto joins = [&](const Step& s, DType dtype, int64_t numel) {
    if (!op_fusable(s.op) || s.out.size() != 1) return false;
    const Operand& o = s.out[0];
    if (o.dtype != dtype || o.shape.numel() != numel || bufs[o.buf].kind != BufKind::Temp)
      return false;
    for (const Operand& i : s.in) {
      const int64_t k = i.shape.numel();
      if (i.dtype != dtype || (k != numel && !(k == 1 && op_broadcasts_one(s.op)))) return false;
    }
    return true;
  };

  // A buffer read with the run's element count and one read as a broadcast single element are
  // two inputs (two arguments may alias one buffer with different shapes): reg and last_in are
  // per read, indexed by read_key.
  auto read_key = [](const Operand& o, int64_t numel) {
    return 2 * o.buf + (o.shape.numel() == 1 && numel > 1);
  };
  std::vector<int> group_of(bufs.size(), -1);     // per buffer: the run producing it (its start)
  std::vector<int> reg(2 * bufs.size(), -1);      // per read: its register in the current run
  std::vector<int> last_in(2 * bufs.size(), -1);  // per read: its last inside the run
  std::vector<Step> steps;
  int n_forward = 0;
  for (int t = 0; t < n;) {
    const Step& first = all_[t];
    const int phase_end = t < n_forward_ ? n_forward_ : n;
    int e = t;
    if (!first.out.empty() &&
        (first.out[0].dtype == DType::Float32 || first.out[0].dtype == DType::Float64)) {
      const DType dtype = first.out[0].dtype;
      const int64_t numel = first.out[0].shape.numel();
      int inputs = 0;
      while (e < phase_end && e - t < FusedProgram::kMaxSteps && joins(all_[e], dtype, numel)) {
        int fresh = 0;  // inputs the run does not read yet (one counted twice at worst)
        for (const Operand& i : all_[e].in)
          fresh += group_of[i.buf] != t && last_in[read_key(i, numel)] < t;
        if (inputs + fresh > FusedProgram::kMaxInputs) break;
        for (const Operand& i : all_[e].in) {
          if (group_of[i.buf] != t && last_in[read_key(i, numel)] < t) ++inputs;
          last_in[read_key(i, numel)] = e;
        }
        group_of[all_[e].out[0].buf] = t;
        ++e;
      }
    }
    if (t < n_forward_) n_forward += 1;
    if (e - t < 2) {
      steps.push_back(std::move(all_[t]));
      t += 1;
      continue;
    }

    auto program = std::make_unique<FusedProgram>();
    FusedProgram& p = *program;
    p.dtype = all_[t].out[0].dtype;
    p.numel = all_[t].out[0].shape.numel();
    Step fused{Op::FusedElementwise, AttrBlob::of(FusedAttrs{program.get()}), -1, {}, {}};
    // Inputs in order of first read; then which produced values leave the run (outputs) and
    // which live in scratch slots, reused once their last reader inside the run has read them.
    // A value the run produces has its element count: its read key is 2 * buffer.
    std::vector<int> touched;
    for (int j = t; j < e; ++j)
      for (const Operand& i : all_[j].in)
        if (const int k = read_key(i, p.numel); group_of[i.buf] != t && reg[k] < 0) {
          if (k % 2) p.broadcast |= uint64_t{1} << p.n_in;
          reg[k] = p.n_in++;
          touched.push_back(k);
          fused.in.push_back(i);
        }
    auto scratch_slot = [&](int b) {  // the scratch slot holding b, or -1
      const int k = reg[2 * b] - p.n_in;
      return group_of[b] == t && k >= 0 && k < FusedProgram::kMaxScratch ? k : -1;
    };
    bool used[FusedProgram::kMaxScratch] = {};
    for (int j = t; j < e; ++j) {
      const Step& s = all_[j];
      for (const Operand& i : s.in)  // a value read for the last time frees its slot
        if (const int k = scratch_slot(i.buf); k >= 0 && last_in[2 * i.buf] == j) used[k] = false;
      const int b = s.out[0].buf;
      touched.push_back(2 * b);
      int free_slot = -1;
      if (escape_[b] < 0 && last_read[b] < e && last_in[2 * b] >= 0)
        for (int k = 0; k < FusedProgram::kMaxScratch && free_slot < 0; ++k)
          if (!used[k]) free_slot = k;
      if (free_slot >= 0) {
        used[free_slot] = true;
        reg[2 * b] = p.scratch_reg(free_slot);
        p.n_scratch = std::max(p.n_scratch, free_slot + 1);
      } else {  // read after the run, or no slot free
        reg[2 * b] = p.out_reg(p.n_out++);
        p.out_instr.push_back(j - t);
        fused.out.push_back(s.out[0]);
      }
    }
    for (int j = t; j < e; ++j) {
      const Step& s = all_[j];
      FusedInstr ins;
      ins.op = s.op;
      ins.out = static_cast<uint8_t>(reg[2 * s.out[0].buf]);
      ins.a = static_cast<uint8_t>(reg[read_key(s.in[0], p.numel)]);
      ins.b = s.in.size() > 1 ? static_cast<uint8_t>(reg[read_key(s.in[1], p.numel)]) : ins.a;
      if (op_has_scalar_attrs(s.op)) ins.scalar = s.attrs.as<ScalarAttrs>().value;
      p.instrs.push_back(ins);
      p.trace_index.push_back(s.index);
    }
    for (int k : touched) reg[k] = -1;
    programs_.push_back(std::move(program));
    steps.push_back(std::move(fused));
    t = e;
  }
  all_ = std::move(steps);
  n_forward_ = n_forward;
}

}  // namespace encore::schedule
