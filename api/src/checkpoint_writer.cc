// encore::save: the safetensors writer (encore/checkpoint.h).
#include <bit>
#include <nlohmann/json.hpp>

#include "api/src/atomic_file.h"
#include "api/src/checkpoint_format.h"
#include "encore/checkpoint.h"
#include "runtime/cuda.h"

namespace encore {

static_assert(std::endian::native == std::endian::little,
              "checkpoints hold little-endian data and are written from memory as it is");

namespace {

nlohmann::json metadata(optim::Optimizer* optimizer, Generator* generator) {
  nlohmann::json meta = nlohmann::json::object();
  meta["format"] = checkpoint::kFormat;
  meta["format_version"] = checkpoint::kFormatVersion;
  if (optimizer) {
    const std::string prefix(checkpoint::kOptimizerPrefix);
    meta[prefix + "kind"] = optimizer->kind();
    meta[prefix + "steps"] = std::to_string(optimizer->steps());
    for (const auto& [name, value] : optimizer->hyper_parameters())
      meta[prefix + name] = checkpoint::format_double(value);
  }
  if (generator) {
    const Generator::Stream s = generator->state();
    meta["generator.seed"] = std::to_string(s.seed);
    meta["generator.offset"] = std::to_string(s.offset);
  }
  return meta;
}

}  // namespace

void save(const std::string& path, const nn::Module& module, optim::Optimizer* optimizer,
          Generator* generator) {
  ENCORE_CHECK(!optimizer || !optimizer->kind().empty(), "save: checkpoint ", path,
               ": the optimizer has no kind() (one defined outside encore must name its kind, "
               "hyper-parameters and state to be saved or loaded)");
  std::vector<checkpoint::Target> tensors = checkpoint::targets(module, optimizer);
  std::erase_if(tensors, [](const checkpoint::Target& t) { return !t.tensor->defined(); });

  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = metadata(optimizer, generator);
  uint64_t offset = 0;
  for (const checkpoint::Target& t : tensors) {
    ENCORE_CHECK(!header.contains(t.name), "save: checkpoint ", path, ": two tensors are named '",
                 t.name, "'");
    const uint64_t bytes = t.tensor->nbytes();
    header[t.name] = {{"dtype", checkpoint::dtype_code(t.dtype)},
                      {"shape", std::vector<int64_t>(t.shape.begin(), t.shape.end())},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t length = text.size();

  AtomicFile file(path, "save: checkpoint " + path);
  file.write(&length, sizeof length);
  file.write(text.data(), text.size());
  std::vector<char> host;
  for (const checkpoint::Target& t : tensors) {
    const Tensor& x = *t.tensor;
    if (x.device().type == DeviceType::CPU) {
      file.write(x.raw_data(), x.nbytes());
    } else {
      host.resize(x.nbytes());
      cuda::copy_bytes(host.data(), Device::cpu(), x.raw_data(), x.device(), x.nbytes());
      file.write(host.data(), host.size());
    }
  }
  file.commit();
}

}  // namespace encore
