// A file written whole or not at all, as checkpoints and exported models are: the bytes go to a
// temporary file beside the target (the same directory, so the rename stays on one file system),
// which is flushed to disk and renamed over the target by commit(). Until then the target keeps
// its old contents; a failure or an exception before commit() removes the temporary file.
#pragma once

#include <cstddef>
#include <string>

namespace encore {

class AtomicFile {
 public:
  // `what` opens every error message ("save: checkpoint run.safetensors").
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  // Flushes and closes the temporary file, then renames it over the target.
  void commit();

 private:
  std::string path_, temp_, what_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace encore
