#include "api/src/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/error.h"

namespace encore {

// The temporary file is made with open(O_EXCL) under a name unique to the process and the call
// rather than with mkstemp, whose files are private (0600): created with 0666, the file gets the
// permissions the user's umask gives any new file, and keeps them when renamed.
AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
  static std::atomic<uint64_t> serial{0};
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    ENCORE_CHECK(fd_ >= 0 || (errno == EEXIST && attempt < 100), what_,
                 ": cannot create a temporary file ", temp_, " (", std::strerror(errno), ")");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    ENCORE_CHECK(n > 0, what_, ": cannot write ", temp_, " (", std::strerror(errno), ")");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  ENCORE_CHECK(::fsync(fd_) == 0, what_, ": cannot flush ", temp_, " (", std::strerror(errno),
               ")");
  const int rc = ::close(fd_);
  fd_ = -1;
  ENCORE_CHECK(rc == 0, what_, ": cannot close ", temp_, " (", std::strerror(errno), ")");
  ENCORE_CHECK(::rename(temp_.c_str(), path_.c_str()) == 0, what_, ": cannot rename ", temp_,
               " over ", path_, " (", std::strerror(errno), ")");
  committed_ = true;
}

}  // namespace encore
