// Early collectives: a data-parallel step starts each bucket's all-reduce when the autograd
// engine has produced the bucket's last gradient, and the engine's order is a function of the
// graph, not of the communication. In a two-layer backward it computes the input gradient of
// the second layer (which the first layer's gradients need) before the second layer's weight
// gradient, so the second layer's bucket starts one product later than it could, with one product
// fewer to hide behind. Here each all-reduce start moves, with every step it depends on, ahead of
// the steps it does not: the starts run as early as the data allows, and the rest of the
// backward runs while they are in flight. Only the order of independent steps changes, so every
// value is the one eager computes.
#include <algorithm>
#include <vector>

#include "schedule/plan.h"

namespace encore::schedule {

// Per phase: the steps each step must follow (it reads what they write, writes what they read
// or write; buffers over one storage count as one; random steps keep their order, and so do
// collectives). Then, for each all-reduce start in recorded order, it and every step it depends
// on that has not been placed yet are placed, in recorded order; the rest follow in recorded
// order. Each placed prefix holds every step its steps depend on, so the order is valid.
void Plan::move_collectives_early() {
  const auto is_start = [](const Step& s) { return s.op == Op::AllReduceStart; };
  if (std::none_of(all_.begin(), all_.end(), is_start)) return;
  const int nb = static_cast<int>(rec_->buffers.size());
  const std::vector<int> memory = storage_ids();

  reorder_phases([&](int begin, int end) {
    std::vector<std::vector<int>> after(all_.size());  // per step, the steps it must follow
    std::vector<int> last_write(nb, -1);
    std::vector<std::vector<int>> readers(nb);  // per memory, its readers since its last write
    int last_random = -1, last_collective = -1;
    for (int t = begin; t < end; ++t) {
      const Step& s = all_[t];
      std::vector<int>& deps = after[t];
      for (const Operand& i : s.in)
        if (last_write[memory[i.buf]] >= 0) deps.push_back(last_write[memory[i.buf]]);
      auto on_write = [&](int m) {
        if (last_write[m] >= 0) deps.push_back(last_write[m]);
        for (int r : readers[m])
          if (r != t) deps.push_back(r);
      };
      for (size_t i = 0; i < s.in.size(); ++i)
        if (op_writes_input(s.op, i)) on_write(memory[s.in[i].buf]);
      for (const Operand& o : s.out) on_write(memory[o.buf]);
      if (op_draws_random(s.op)) {
        if (last_random >= 0) deps.push_back(last_random);
        last_random = t;
      }
      if (op_collective(s.op)) {
        if (last_collective >= 0) deps.push_back(last_collective);
        last_collective = t;
      }
      for (const Operand& i : s.in) readers[memory[i.buf]].push_back(t);
      auto written = [&](int m) {
        last_write[m] = t;
        readers[m].clear();
      };
      for (size_t i = 0; i < s.in.size(); ++i)
        if (op_writes_input(s.op, i)) written(memory[s.in[i].buf]);
      for (const Operand& o : s.out) written(memory[o.buf]);
    }

    std::vector<char> placed(all_.size(), 0);
    std::vector<int> order, cone, stack;
    for (int t = begin; t < end; ++t) {
      if (!is_start(all_[t]) || placed[t]) continue;
      cone.clear();
      stack.assign(1, t);
      placed[t] = 1;
      while (!stack.empty()) {
        const int u = stack.back();
        stack.pop_back();
        cone.push_back(u);
        for (int d : after[u])
          if (!placed[d]) {
            placed[d] = 1;
            stack.push_back(d);
          }
      }
      std::sort(cone.begin(), cone.end());
      order.insert(order.end(), cone.begin(), cone.end());
    }
    for (int t = begin; t < end; ++t)
      if (!placed[t]) order.push_back(t);
    return order;
  });
}

}  // namespace encore::schedule
