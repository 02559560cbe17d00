// Datasets in IDX format (MNIST, Fashion-MNIST), gzipped or plain, and a batch iterator.
//
//   auto train = data::load_idx_dataset(data::kFashionMnistDir, data::Split::Train);
//   data::BatchIterator it(train, 100, /*shuffle=*/true, /*seed=*/0);
//   Tensor x, t;
//   while (it.next(x, t)) { ... }   // x [B, 784] float32 in [0,1], t [B] int32
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "encore/functions.h"

namespace encore::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

enum class Split { Train, Test };

struct Dataset {
  Tensor images;        // [N, rows*cols] float32, pixel / 255
  Tensor labels;        // [N] int32, each in [0, classes)
  int64_t classes = 0;  // 0: not known
  int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

// Reads an IDX image file (magic 0x803) as [N, rows*cols] float32 in [0,1]. Throws Error
// naming the file on a missing file or a malformed header.
Tensor read_idx_images(const std::string& path);
// Reads an IDX label file (magic 0x801) as [N] int32.
Tensor read_idx_labels(const std::string& path);
// Whether `dir` holds the four MNIST-style files (train-images-idx3-ubyte[.gz], ...).
bool idx_dataset_available(const std::string& dir);
// Loads one split of an MNIST-style directory; `limit` > 0 keeps only the first `limit` samples.
// Throws Error naming the file and the label when a label is outside [0, classes).
Dataset load_idx_dataset(const std::string& dir, Split split, int64_t limit = 0,
                         int64_t classes = 10);

// A synthetic, learnable classification set: each class is a Gaussian blob around its own
// random centre in `features` dimensions. The centres depend only on `features` and `classes`;
// `seed` draws the samples, so two seeds give a train and a test split of the same task.
Dataset synthetic_classification(int64_t n, int64_t features, int64_t classes, uint64_t seed);

// Batches of a dataset in order or in a seeded random permutation (reshuffled every epoch).
// The last batch may be smaller. The iterator keeps its own Dataset (a copy shares the tensors'
// storage), so it may outlive the one it was built from.
class BatchIterator {
 public:
  BatchIterator(const Dataset& ds, int64_t batch_size, bool shuffle, uint64_t seed = 0);
  // Fills x and t with the next batch; false when the epoch is over (the next call starts a new
  // epoch).
  bool next(Tensor& x, Tensor& t);
  int64_t batches_per_epoch() const;
  int64_t position() const { return pos_; }
  // Batches in page-locked host memory (as PyTorch's DataLoader(pin_memory=True)), so
  // x.to(Device::cuda(), /*non_blocking=*/true) overlaps with the device's work. Needs a CUDA
  // device (the first batch throws Error otherwise).
  BatchIterator& set_pin_memory(bool on = true) {
    pin_memory_ = on;
    return *this;
  }
  // Batches on `device`. On a CUDA device they are gathered in pinned memory and copied without
  // blocking (queued on the device's stream), so the copy overlaps with the previous step.
  BatchIterator& set_device(Device device) {
    device_ = device;
    pin_memory_ = device.type == DeviceType::CUDA;
    return *this;
  }
  // Data parallelism: this process reads shard `index` of `count` (dist::rank() of
  // dist::world_size()). Every epoch's order (the same permutation on every process: give them
  // one seed) is cut into `count` disjoint runs of floor(N / count) samples, the rest left out,
  // so every shard has the same number of batches. Restarts the epoch.
  BatchIterator& set_shard(int index, int count);

 private:
  void reshuffle();
  Dataset ds_;
  int64_t batch_size_;
  bool shuffle_;
  bool pin_memory_ = false;
  Device device_ = Device::cpu();
  uint64_t seed_;
  uint64_t epoch_ = 0;
  int64_t pos_ = 0;
  int shard_ = 0, shards_ = 1;
  std::vector<int64_t> order_;  // this shard's samples of the epoch
};

}  // namespace encore::data
