// onnxruntime runs the models encore exports and gets encore's eval results: SeedCnn, VggSmall,
// the MLP, CharLstm's one-step cell (tokens, h, c -> logits, h', c') and TinyGpt, each traced at
// batch 4 and run at batch 4 and 7 (the batch is symbolic in the files); a function adding a
// constant it makes in the batch's shape, which the file must make at the batch it runs at; one
// broadcasting tensors without a batch to it; and one counting to the batch size with arange.
// encore writes each model, its inputs and its outputs; compare.py runs them and checks every
// element to a relative error of 1e-5, with an absolute floor of 1e-6 of the output's largest
// magnitude for elements near zero (see compare.py). Exits with 77 (skipped) when python3 cannot
// import onnxruntime and numpy.
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <string>

#include "encore/encore.h"

using namespace encore;
namespace fs = std::filesystem;

namespace {

// A tensor as a NumPy .npy file (version 1.0, little-endian, C order).
void write_npy(const fs::path& path, const Tensor& t) {
  const char* descr = t.dtype() == DType::Float32   ? "<f4"
                      : t.dtype() == DType::Float64 ? "<f8"
                      : t.dtype() == DType::Int32   ? "<i4"
                      : t.dtype() == DType::Int64   ? "<i8"
                                                    : "|b1";
  std::string shape;
  for (int64_t d : t.shape()) shape += std::to_string(d) + ",";
  std::string header =
      "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (" + shape + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  out.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
}

struct Case {
  std::string name;
  std::vector<std::string> inputs;
  // The inputs at a batch size.
  std::function<std::vector<Tensor>(int64_t)> make_inputs;
  // encore's eval results on them.
  std::function<std::vector<Tensor>(const std::vector<Tensor>&)> run;
  std::function<void(const std::string&, const OnnxOptions&)> export_to;
};

// Random token ids in [0, vocab).
Tensor tokens(int64_t batch, int64_t time, int64_t vocab) {
  static std::mt19937 gen(11);
  std::vector<double> ids(static_cast<size_t>(batch * time));
  for (double& id : ids) id = static_cast<double>(gen() % static_cast<uint32_t>(vocab));
  return tensor(ids, {batch, time}, DType::Int64);
}

}  // namespace

int main() {
  if (std::system("python3 -c 'import onnxruntime, numpy' 2>/dev/null") != 0) {
    std::cout << "onnx_runtime_check: skipped (python3 cannot import onnxruntime and numpy)\n";
    return 77;
  }
  const fs::path dir = fs::temp_directory_path() / ("encore_onnx_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  try {
    manual_seed(7);
    auto cnn = std::make_shared<models::SeedCnn>(8);
    auto vgg = std::make_shared<models::VggSmall>(3, std::vector<int64_t>{8, 16});
    auto mlp = nn::mlp(784, 64, 10);
    auto lstm = std::make_shared<models::CharLstm>(20, 16, 32);
    auto gpt = std::make_shared<models::TinyGpt>(20, 16, 32, 4, 2);
    for (nn::Module* m : {static_cast<nn::Module*>(cnn.get()), static_cast<nn::Module*>(vgg.get()),
                          static_cast<nn::Module*>(mlp.get()), static_cast<nn::Module*>(lstm.get()),
                          static_cast<nn::Module*>(gpt.get())})
      m->eval();
    auto cell = static_graph(
        [&](const Tensor& t, const Tensor& h, const Tensor& c) { return lstm->forward(t, h, c); },
        {.name = "char_lstm_cell", .arg_names = {"tokens", "h", "c"}, .modules = {lstm}});

    auto one = [](std::shared_ptr<nn::Module> m, std::string name,
                  std::function<Tensor(int64_t)> input) {
      return Case{name,
                  {"input"},
                  [input](int64_t b) { return std::vector<Tensor>{input(b)}; },
                  [m](const std::vector<Tensor>& in) {
                    NoGradGuard g;
                    return std::vector<Tensor>{m->forward(in[0])};
                  },
                  [m, input](const std::string& path, const OnnxOptions& o) {
                    OnnxOptions with = o;
                    with.example_args = {input(4)};
                    export_onnx(*m, path, with);
                  }};
    };
    std::vector<Case> cases = {
        one(cnn, "seed_cnn",
            [](int64_t b) {
              return randn({b, 784});
            }),
        one(vgg, "vgg_small",
            [](int64_t b) {
              return randn({b, 3, 20, 20});
            }),
        one(mlp, "mlp",
            [](int64_t b) {
              return randn({b, 784});
            }),
        one(gpt, "tiny_gpt", [](int64_t b) { return tokens(b, 12, 20); }),
        Case{"char_lstm_cell",
             {"tokens", "h", "c"},
             [](int64_t b) {
               return std::vector<Tensor>{tokens(b, 1, 20), randn({1, b, 32}), randn({1, b, 32})};
             },
             [&](const std::vector<Tensor>& in) {
               NoGradGuard g;
               auto [y, h, c] = lstm->forward(in[0], in[1], in[2]);
               return std::vector<Tensor>{y, h, c};
             },
             [&](const std::string& path, const OnnxOptions& o) {
               OnnxOptions with = o;
               with.example_args = {tokens(4, 1, 20), randn({1, 4, 32}), randn({1, 4, 32})};
               with.batch_dims = {0, 1, 1};
               export_onnx(cell, path, with);
             }},
    };
    auto shifted = static_graph(
        [](const Tensor& x) {
          return F::add(x, full({x.size(0), 3}, 0.5));
        },
        {.name = "shifted"});
    cases.push_back(Case{"batch_constant",
                         {"input"},
                         [](int64_t b) {
                           return std::vector<Tensor>{randn({b, 3})};
                         },
                         [](const std::vector<Tensor>& in) {
                           return std::vector<Tensor>{F::add(in[0], full({in[0].size(0), 3}, 0.5))};
                         },
                         [&](const std::string& path, const OnnxOptions& o) {
                           OnnxOptions with = o;
                           with.example_args = {randn({4, 3})};
                           export_onnx(shifted, path, with);
                         }});
    // A [1, 3] tensor broadcast to the batch and a mean over the batch broadcast back: neither
    // has the batch before its broadcast, so the file must take it from the input.
    const Tensor cls = randn({1, 3});
    auto with_cls = [cls](const Tensor& x) {
      const Tensor centred = F::sub(x, F::broadcast_to(F::mean(x, {0}, true), x.shape()));
      return F::concat({F::broadcast_to(cls, {x.size(0), 3}), centred}, 1);
    };
    auto broadcast = static_graph(with_cls, {.name = "broadcast"});
    cases.push_back(
        Case{"batch_broadcast",
             {"input"},
             [](int64_t b) {
               return std::vector<Tensor>{randn({b, 5})};
             },
             [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{with_cls(in[0])}; },
             [&](const std::string& path, const OnnxOptions& o) {
               OnnxOptions with = o;
               with.example_args = {randn({4, 5})};
               export_onnx(broadcast, path, with);
             }});
    // Each row scaled by its index, counted by arange to the batch size: the file must count
    // to the batch it runs at (a Range), not the traced one.
    auto by_row = [](const Tensor& x) {
      return F::mul(x, F::reshape(arange(x.size(0)), {x.size(0), 1}));
    };
    auto counted = static_graph(by_row, {.name = "counted"});
    cases.push_back(
        Case{"batch_arange",
             {"input"},
             [](int64_t b) {
               return std::vector<Tensor>{randn({b, 3})};
             },
             [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{by_row(in[0])}; },
             [&](const std::string& path, const OnnxOptions& o) {
               OnnxOptions with = o;
               with.example_args = {randn({4, 3})};
               export_onnx(counted, path, with);
             }});
    std::ofstream manifest(dir / "manifest.txt");
    for (const Case& c : cases) {
      const std::string model = (dir / (c.name + ".onnx")).string();
      c.export_to(model, {});
      manifest << "model " << c.name << " " << model << "\n";
      for (int64_t batch : {4, 7}) {
        const std::vector<Tensor> in = c.make_inputs(batch);
        const std::vector<Tensor> out = c.run(in);
        manifest << "run " << batch << "\n";
        for (size_t i = 0; i < in.size(); ++i) {
          const fs::path p =
              dir / (c.name + "_" + std::to_string(batch) + "_in" + std::to_string(i) + ".npy");
          write_npy(p, in[i]);
          manifest << "input " << c.inputs[i] << " " << p.string() << "\n";
        }
        for (size_t k = 0; k < out.size(); ++k) {
          const fs::path p =
              dir / (c.name + "_" + std::to_string(batch) + "_out" + std::to_string(k) + ".npy");
          write_npy(p, out[k]);
          manifest << "output " << p.string() << "\n";
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "onnx_runtime_check: " << e.what() << "\n";
    fs::remove_all(dir);
    return 1;
  }
  const std::string command =
      "python3 " ENCORE_ONNX_COMPARE_SCRIPT " '" + (dir / "manifest.txt").string() + "'";
  const int rc = std::system(command.c_str());
  fs::remove_all(dir);
  return rc == 0 ? 0 : 1;
}
