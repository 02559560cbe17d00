// encore::save: the safetensors writer (encore/checkpoint.h).
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "api/src/checkpoint_format.h"
#include "encore/checkpoint.h"
#include "runtime/cuda.h"

namespace encore {

static_assert(std::endian::native == std::endian::little,
              "checkpoints hold little-endian data and are written from memory as it is");

namespace {

// A file descriptor closed (and its file removed unless kept) when it goes out of scope.
class TempFile {
 public:
  TempFile(const std::string& target) : path_(target + ".tmp.XXXXXX") {
    fd_ = ::mkstemp(path_.data());
    ENCORE_CHECK(fd_ >= 0, "save: checkpoint ", target, ": cannot create a temporary file ", path_,
                 " (", std::strerror(errno), ")");
  }
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!kept_) ::unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  void write(const std::string& target, const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      ENCORE_CHECK(n > 0, "save: checkpoint ", target, ": cannot write ", path_, " (",
                   std::strerror(errno), ")");
      p += n;
      bytes -= static_cast<size_t>(n);
    }
  }
  // Flushes and closes the file, then renames it over `target`.
  void commit(const std::string& target) {
    ENCORE_CHECK(::fsync(fd_) == 0, "save: checkpoint ", target, ": cannot flush ", path_, " (",
                 std::strerror(errno), ")");
    const int rc = ::close(fd_);
    fd_ = -1;
    ENCORE_CHECK(rc == 0, "save: checkpoint ", target, ": cannot close ", path_, " (",
                 std::strerror(errno), ")");
    ENCORE_CHECK(::rename(path_.c_str(), target.c_str()) == 0, "save: checkpoint ", target,
                 ": cannot rename ", path_, " over it (", std::strerror(errno), ")");
    kept_ = true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool kept_ = false;
};

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

  TempFile file(path);
  file.write(path, &length, sizeof length);
  file.write(path, text.data(), text.size());
  std::vector<char> host;
  for (const checkpoint::Target& t : tensors) {
    const Tensor& x = *t.tensor;
    if (x.device().type == DeviceType::CPU) {
      file.write(path, x.raw_data(), x.nbytes());
    } else {
      host.resize(x.nbytes());
      cuda::copy_bytes(host.data(), Device::cpu(), x.raw_data(), x.device(), x.nbytes());
      file.write(path, host.data(), host.size());
    }
  }
  file.commit(path);
}

}  // namespace encore
