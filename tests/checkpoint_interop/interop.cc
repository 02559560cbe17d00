// encore's checkpoints and Python's safetensors package read each other: a checkpoint saved here
// is read by safetensors, written again by it (in its own layout) and loaded back here to the
// same bits. Exits with 77 (skipped) when python3 cannot import safetensors and numpy.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "encore/encore.h"

using namespace encore;

namespace {

struct State {
  std::vector<Tensor> tensors;
  int64_t steps;
  Generator::Stream stream;
};

State state_of(nn::Module& m, optim::Optimizer& opt, Generator& gen) {
  State s{{}, opt.steps(), gen.state()};
  for (const Tensor& p : m.parameters()) s.tensors.push_back(encore::clone(p).detach());
  for (const optim::StateSlot& slot : opt.state_slots())
    s.tensors.push_back(encore::clone(*slot.tensor));
  return s;
}

bool same(const State& a, const State& b) {
  if (a.tensors.size() != b.tensors.size() || a.steps != b.steps || !(a.stream == b.stream))
    return false;
  for (size_t i = 0; i < a.tensors.size(); ++i)
    if (a.tensors[i].nbytes() != b.tensors[i].nbytes() ||
        std::memcmp(a.tensors[i].raw_data(), b.tensors[i].raw_data(), a.tensors[i].nbytes()) != 0)
      return false;
  return true;
}

}  // namespace

int main() {
  if (std::system("python3 -c 'import safetensors.numpy, numpy' 2>/dev/null") != 0) {
    std::cout << "checkpoint_interop: skipped (python3 cannot import safetensors and numpy)\n";
    return 77;
  }
  const auto dir =
      std::filesystem::temp_directory_path() / ("encore_interop_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string ours = (dir / "encore.safetensors").string();
  const std::string theirs = (dir / "python.safetensors").string();

  manual_seed(4);
  auto model = nn::mlp(3, 4, 2);
  optim::Adam opt(model->parameters());
  for (int i = 0; i < 2; ++i) {
    Tensor loss = F::softmax_cross_entropy((*model)(randn({5, 3})), zeros({5}, DType::Int64));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  Generator gen(31);
  gen.reserve(12);
  save(ours, *model, &opt, &gen);
  const State expected = state_of(*model, opt, gen);

  const std::string command = "python3 " ENCORE_INTEROP_SCRIPT " '" + ours + "' '" + theirs + "'";
  const int rc = std::system(command.c_str());
  int status = 1;
  if (rc != 0) {
    std::cerr << "checkpoint_interop: " << command << " failed (" << rc << ")\n";
  } else {
    manual_seed(5);
    auto fresh = nn::mlp(3, 4, 2);
    optim::Adam fresh_opt(fresh->parameters());
    Generator fresh_gen;
    load(theirs, *fresh, &fresh_opt, &fresh_gen);
    if (same(state_of(*fresh, fresh_opt, fresh_gen), expected)) {
      std::cout << "checkpoint_interop: safetensors read and wrote the checkpoint; same bits\n";
      status = 0;
    } else {
      std::cerr << "checkpoint_interop: the checkpoint safetensors wrote loads other values\n";
    }
  }
  std::filesystem::remove_all(dir);
  return status;
}
