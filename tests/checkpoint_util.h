// Helpers shared by the checkpoint tests: a snapshot of everything a load may change, and
// files written byte by byte.
#pragma once

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "encore/encore.h"
#include "test_util.h"

namespace encore::testing {

// A fresh path in the temporary directory, removed (with its leftovers) at the end of the scope.
class TempPath {
 public:
  explicit TempPath(const std::string& stem)
      : dir_(std::filesystem::temp_directory_path() /
             ("encore_ckpt_" + stem + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~TempPath() { std::filesystem::remove_all(dir_); }
  TempPath(const TempPath&) = delete;
  TempPath& operator=(const TempPath&) = delete;
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// Everything a load may change: host copies of the module's parameters and buffers and of the
// optimizer's state, its step count and hyper-parameters, and the generator's state.
struct Snapshot {
  std::vector<std::pair<std::string, Tensor>> tensors;
  int64_t steps = 0;
  std::vector<std::pair<std::string, double>> hyper_parameters;
  Generator::Stream stream{};

  Snapshot(nn::Module& m, optim::Optimizer* opt, Generator* gen) {
    for (const auto& [name, t] : m.named_parameter_slots()) tensors.emplace_back(name, on_host(*t));
    for (const auto& [name, t] : m.named_buffer_slots()) tensors.emplace_back(name, on_host(*t));
    if (opt) {
      for (const optim::StateSlot& s : opt->state_slots())
        tensors.emplace_back("optimizer." + s.name, on_host(*s.tensor));
      steps = opt->steps();
      hyper_parameters = opt->hyper_parameters();
    }
    if (gen) stream = gen->state();
  }
  // "" when equal, otherwise the first difference.
  std::string diff(const Snapshot& o) const {
    if (tensors.size() != o.tensors.size()) return "tensor counts differ";
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].first != o.tensors[i].first) return "names differ: " + tensors[i].first;
      const std::string d = bit_diff(tensors[i].second, o.tensors[i].second);
      if (!d.empty()) return tensors[i].first + ": " + d;
    }
    if (steps != o.steps) return "optimizer steps differ";
    if (hyper_parameters != o.hyper_parameters) return "hyper-parameters differ";
    if (!(stream == o.stream)) return "generator states differ";
    return "";
  }
};

}  // namespace encore::testing
