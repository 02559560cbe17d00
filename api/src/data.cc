#include "encore/data.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numbers>
#include <random>
#include <string_view>
#include <system_error>

namespace encore::data {

namespace {

namespace fs = std::filesystem;

constexpr uint8_t kUnsignedByte = 0x08;  // IDX element type code

// `path` when it exists, else `path.gz` when that exists, else empty.
std::string find_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;
  if (fs::is_regular_file(path + ".gz", ec)) return path + ".gz";
  return {};
}

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    ENCORE_CHECK(f_ != nullptr, "IDX file ", path, ": cannot open (", std::strerror(errno), ")");
  }
  ~GzFile() { gzclose(f_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to `n` bytes; returns how many were read (fewer only at the end of the data).
  size_t read(void* dst, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_, static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(f_, &code);
        fail("IDX file ", path_, ": read error (", msg ? msg : "unknown", ")");
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // A gzip stream cut short reads as a short count with a pending error; report it as what it is.
  void check_stream(std::string_view what) {
    int code = Z_OK;
    const char* msg = gzerror(f_, &code);
    if (code != Z_OK && code != Z_STREAM_END)
      fail("IDX file ", path_, ": corrupt or truncated gzip data while reading ", what, " (",
           msg ? msg : "unknown", ")");
  }

  bool is_plain() { return gzdirect(f_) == 1; }

 private:
  std::string path_;
  gzFile f_;
};

uint32_t read_be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// The header dimensions and the raw bytes of an IDX file of unsigned bytes with `want_rank`
// dimensions.
struct IdxData {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

IdxData read_idx(const std::string& requested, int want_rank, std::string_view kind) {
  const std::string path = find_file(requested);
  ENCORE_CHECK(!path.empty(), "IDX ", kind, " file ", requested, ": not found (nor ", requested,
               ".gz)");
  GzFile f(path);

  unsigned char magic[4];
  if (f.read(magic, 4) != 4) {
    f.check_stream("the header");
    fail("IDX file ", path, ": truncated header (fewer than 4 bytes)");
  }
  const uint32_t want_magic = (uint32_t{kUnsignedByte} << 8) | static_cast<uint32_t>(want_rank);
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != kUnsignedByte || magic[3] != want_rank) {
    fail("IDX file ", path, ": bad magic number 0x",
         absl::StrCat(absl::Hex(read_be32(magic), absl::kZeroPad8)), ", expected 0x",
         absl::StrCat(absl::Hex(want_magic, absl::kZeroPad8)), " (unsigned bytes, ", want_rank,
         want_rank == 1 ? " dimension" : " dimensions", ", an IDX ", kind, " file)");
  }

  std::array<unsigned char, 4 * 3> raw{};
  const size_t header_dims = 4 * static_cast<size_t>(want_rank);
  if (f.read(raw.data(), header_dims) != header_dims) {
    f.check_stream("the header");
    fail("IDX file ", path, ": truncated header (", want_rank, " dimension sizes expected)");
  }
  IdxData out;
  int64_t total = 1;
  for (int i = 0; i < want_rank; ++i) {
    const int64_t d = read_be32(raw.data() + 4 * i);
    ENCORE_CHECK(d <= std::numeric_limits<int32_t>::max(), "IDX file ", path, ": dimension ", i,
                 " is ", d, ", too large");
    ENCORE_CHECK(i == 0 || d > 0, "IDX file ", path, ": dimension ", i, " is 0");
    ENCORE_CHECK(d == 0 || total <= (int64_t{1} << 40) / d, "IDX file ", path,
                 ": dimensions are too large");
    total *= d;
    out.dims.push_back(d);
  }

  const int64_t header_bytes = 4 + static_cast<int64_t>(header_dims);
  if (f.is_plain()) {
    std::error_code ec;
    const auto size = static_cast<int64_t>(fs::file_size(path, ec));
    ENCORE_CHECK(!ec, "IDX file ", path, ": cannot read its size (", ec.message(), ")");
    ENCORE_CHECK(
        size == header_bytes + total, "IDX file ", path, ": file is ", size,
        " bytes but its header promises ", header_bytes + total, " (", header_bytes,
        " of header and ", total, " of data)",
        size < header_bytes + total ? "; the file is truncated" : "; extra bytes follow the data");
  }

  // Read in chunks, growing the buffer only as data arrives: a small gzip file whose header
  // promises terabytes fails as truncated instead of allocating them. (A plain file's size
  // was checked above, so it can be allocated at once.)
  if (f.is_plain()) out.bytes.reserve(static_cast<size_t>(total));
  constexpr size_t kChunk = size_t{1} << 20;
  const auto want = static_cast<size_t>(total);
  size_t got = 0;
  while (got < want) {
    const size_t n = std::min(kChunk, want - got);
    out.bytes.resize(got + n);
    const size_t read = f.read(out.bytes.data() + got, n);
    got += read;
    if (read < n) break;
  }
  if (got != want) {
    f.check_stream("the data");
    fail("IDX file ", path, ": truncated, the header promises ", total, " data bytes but only ",
         got, " follow");
  }
  unsigned char extra;
  if (f.read(&extra, 1) != 0)
    fail("IDX file ", path, ": more data than the header promises (", total, " bytes)");
  f.check_stream("the data");
  return out;
}

std::string split_prefix(Split split) {
  return split == Split::Train ? "train" : "t10k";
}

// The first `n` rows of `t` in a new tensor.
Tensor first_rows(const Tensor& t, int64_t n) {
  Shape s = t.shape();
  const size_t row_bytes = t.numel() ? t.nbytes() / static_cast<size_t>(t.size(0)) : 0;
  s.set(0, n);
  Tensor out = Tensor::empty(s, t.dtype());
  if (n > 0) std::memcpy(out.raw_data(), t.raw_data(), row_bytes * static_cast<size_t>(n));
  return out;
}

// A uniform double in [0, 1) and a standard normal from the same engine, defined here rather
// than by <random>'s distributions so the data are the same under every standard library.
double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1p-53;
}
double standard_normal(std::mt19937_64& rng) {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1]
  const double u2 = uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// One step of splitmix64: a bijective mix, so nearby inputs give unrelated outputs.
uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

Tensor read_idx_images(const std::string& path) {
  IdxData d = read_idx(path, 3, "image");
  const int64_t n = d.dims[0];
  const int64_t pixels = d.dims[1] * d.dims[2];
  Tensor out = Tensor::empty({n, pixels}, DType::Float32);
  float* p = out.data<float>();
  for (size_t i = 0; i < d.bytes.size(); ++i) p[i] = static_cast<float>(d.bytes[i]) / 255.0f;
  return out;
}

Tensor read_idx_labels(const std::string& path) {
  IdxData d = read_idx(path, 1, "label");
  Tensor out = Tensor::empty({d.dims[0]}, DType::Int32);
  int32_t* p = out.data<int32_t>();
  for (size_t i = 0; i < d.bytes.size(); ++i) p[i] = d.bytes[i];
  return out;
}

bool idx_dataset_available(const std::string& dir) {
  for (const char* name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                           "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    if (find_file((fs::path(dir) / name).string()).empty()) return false;
  }
  return true;
}

Dataset load_idx_dataset(const std::string& dir, Split split, int64_t limit, int64_t classes) {
  ENCORE_CHECK(limit >= 0, "load_idx_dataset: limit must be >= 0, it is ", limit);
  ENCORE_CHECK(classes > 0, "load_idx_dataset: classes must be > 0, it is ", classes);
  const std::string prefix = (fs::path(dir) / split_prefix(split)).string();
  const std::string label_file = prefix + "-labels-idx1-ubyte";
  Dataset ds;
  ds.images = read_idx_images(prefix + "-images-idx3-ubyte");
  ds.labels = read_idx_labels(label_file);
  ds.classes = classes;
  ENCORE_CHECK(ds.images.size(0) == ds.labels.size(0), "load_idx_dataset: ", prefix,
               "-images-idx3-ubyte holds ", ds.images.size(0), " images but ", label_file,
               " holds ", ds.labels.size(0), " labels");
  const int32_t* label = ds.labels.data<int32_t>();
  for (int64_t i = 0; i < ds.labels.numel(); ++i)
    ENCORE_CHECK(label[i] >= 0 && label[i] < classes, "load_idx_dataset: ", label_file, ": label ",
                 label[i], " of sample ", i, " is not a class of this data set (0 to ", classes - 1,
                 ")");
  if (limit > 0 && limit < ds.size()) {
    ds.images = first_rows(ds.images, limit);
    ds.labels = first_rows(ds.labels, limit);
  }
  return ds;
}

Dataset synthetic_classification(int64_t n, int64_t features, int64_t classes, uint64_t seed) {
  ENCORE_CHECK(n >= 0 && features > 0 && classes > 0,
               "synthetic_classification: need n >= 0, features > 0 and classes > 0; got n=", n,
               ", features=", features, ", classes=", classes);
  ENCORE_CHECK(classes <= std::numeric_limits<int32_t>::max(),
               "synthetic_classification: too many classes (", classes, ")");
  constexpr double kNoise = 0.5;          // per-feature standard deviation around a centre
  constexpr double kMinGap = 8 * kNoise;  // centres at least this far apart, when it can be had
  // The centres come from a fixed seed, so sets drawn with different seeds are samples of one
  // task (a train and a test split). Each is ~ N(0, 2^2) per feature, redrawn (a bounded number
  // of times) when too close to an earlier one, so even a few features give separated blobs.
  std::mt19937_64 centre_rng(0x5eedc0de);
  std::vector<double> centres(static_cast<size_t>(classes * features));
  for (int64_t c = 0; c < classes; ++c) {
    double* mine = &centres[static_cast<size_t>(c * features)];
    for (int attempt = 0; attempt < 100; ++attempt) {
      for (int64_t j = 0; j < features; ++j) mine[j] = 2.0 * standard_normal(centre_rng);
      bool far = true;
      for (int64_t o = 0; o < c && far; ++o) {
        const double* other = &centres[static_cast<size_t>(o * features)];
        double d2 = 0;
        for (int64_t j = 0; j < features; ++j) d2 += (mine[j] - other[j]) * (mine[j] - other[j]);
        far = d2 >= kMinGap * kMinGap;
      }
      if (far) break;
    }
  }

  std::mt19937_64 rng(seed);
  Dataset ds;
  ds.images = Tensor::empty({n, features}, DType::Float32);
  ds.labels = Tensor::empty({n}, DType::Int32);
  ds.classes = classes;
  float* x = ds.images.data<float>();
  int32_t* t = ds.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = static_cast<int64_t>(rng() % static_cast<uint64_t>(classes));
    t[i] = static_cast<int32_t>(c);
    const double* centre = &centres[static_cast<size_t>(c * features)];
    for (int64_t j = 0; j < features; ++j)
      x[i * features + j] = static_cast<float>(centre[j] + kNoise * standard_normal(rng));
  }
  return ds;
}

BatchIterator::BatchIterator(const Dataset& ds, int64_t batch_size, bool shuffle, uint64_t seed)
    : ds_(ds), batch_size_(batch_size), shuffle_(shuffle), seed_(seed) {
  ENCORE_CHECK(batch_size > 0, "BatchIterator: batch_size must be positive, it is ", batch_size);
  ENCORE_CHECK(ds.images.defined() && ds.labels.defined(),
               "BatchIterator: the dataset has no images or no labels");
  ENCORE_CHECK(
      ds.images.rank() >= 1 && ds.labels.rank() == 1 && ds.images.size(0) == ds.labels.size(0),
      "BatchIterator: images ", ds.images.shape(), " and labels ", ds.labels.shape(),
      " must be [N, ...] and [N]");
  ENCORE_CHECK(ds.images.device() == Device::cpu() && ds.labels.device() == Device::cpu(),
               "BatchIterator: the dataset must be on the cpu");
  reshuffle();
}

void BatchIterator::reshuffle() {
  order_.resize(static_cast<size_t>(ds_.size()));
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
  if (shuffle_) {
    // Fisher-Yates written out (std::shuffle's algorithm varies between standard libraries).
    // Seed and epoch mixed, not added: seed s at epoch e + 1 must not repeat seed s + 1 at e.
    std::mt19937_64 rng(splitmix64(splitmix64(seed_) + epoch_));
    for (size_t i = order_.size(); i > 1; --i) {
      const size_t j = static_cast<size_t>(rng() % i);
      std::swap(order_[i - 1], order_[j]);
    }
  }
  if (shards_ > 1) {
    const size_t per = order_.size() / static_cast<size_t>(shards_);
    order_.erase(order_.begin(), order_.begin() + static_cast<ptrdiff_t>(per * shard_));
    order_.resize(per);
  }
}

BatchIterator& BatchIterator::set_shard(int index, int count) {
  ENCORE_CHECK(count >= 1 && index >= 0 && index < count, "BatchIterator::set_shard: shard ", index,
               " of ", count, " does not exist (0 <= index < count)");
  ENCORE_CHECK(ds_.size() >= count, "BatchIterator::set_shard: ", ds_.size(),
               " samples cannot make ", count, " shards");
  shard_ = index;
  shards_ = count;
  pos_ = 0;
  reshuffle();
  return *this;
}

int64_t BatchIterator::batches_per_epoch() const {
  const auto n = static_cast<int64_t>(order_.size());
  return n / batch_size_ + (n % batch_size_ != 0);  // (no n + batch - 1: a huge batch overflows)
}

bool BatchIterator::next(Tensor& x, Tensor& t) {
  const int64_t n = static_cast<int64_t>(order_.size());
  if (pos_ >= n) {
    ++epoch_;
    pos_ = 0;
    reshuffle();
    return false;
  }
  const int64_t b = std::min(batch_size_, n - pos_);
  auto gather = [&](const Tensor& src) {
    Shape s = src.shape();
    const size_t row = src.nbytes() / static_cast<size_t>(src.size(0));
    s.set(0, b);
    Tensor out = pin_memory_ ? Tensor::empty_pinned(s, src.dtype()) : Tensor::empty(s, src.dtype());
    const char* from = static_cast<const char*>(src.raw_data());
    char* to = static_cast<char*>(out.raw_data());
    for (int64_t i = 0; i < b; ++i)
      std::memcpy(to + static_cast<size_t>(i) * row,
                  from + static_cast<size_t>(order_[static_cast<size_t>(pos_ + i)]) * row, row);
    return out;
  };
  x = gather(ds_.images).to(device_, /*non_blocking=*/true);
  t = gather(ds_.labels).to(device_, /*non_blocking=*/true);
  pos_ += b;
  return true;
}

}  // namespace encore::data
