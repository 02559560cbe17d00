// cuda::Graph beside other threads and streams (runtime/cuda.h): the graphs captured on one
// thread's capture streams share their cuBLAS and cuDNN workspaces, so a launch from another
// stream than the one they are bound to is queued there, in order with the caller's stream; a
// device synchronisation another thread asks for during a capture waits for it to end, and device
// memory freed meanwhile is freed after it, so the capture succeeds (a tensor recorded on the
// capturing stream too); a thread's capture streams
// go to the next thread together; a capture is ended on its own thread only. The gate itself is
// tested on the host (capture_gate_test.cc).
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "encore/encore.h"
#include "runtime/allocator.h"
#include "runtime/capture_gate.h"
#include "runtime/cuda.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/order_log.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {

constexpr int kDevice = 0;

// Captures `y = x` on this thread's capture stream; `during` runs inside the capture.
template <typename During>
bool capture_copy(cuda::Graph& g, const Tensor& y, const Tensor& x, During during) {
  const cuda::StreamHandle s = cuda::capture_stream(kDevice);
  const cuda::StreamGuard on(kDevice, s);
  g.begin_capture(s);
  during();
  copy_on(s, y, x);
  return g.end_capture();
}

void wait_for_flag(const std::atomic<bool>& flag) {
  while (!flag.load()) std::this_thread::yield();
}

// Another thread capturing y = x on its capture stream, the capture held open (from the
// constructor's return) until end().
class HeldCapture {
 public:
  HeldCapture(const Tensor& y, const Tensor& x)
      : thread_([this, y, x] {
          try {
            cuda::set_device(kDevice);
            cuda::Graph g;
            captured_ = capture_copy(g, y, x, [&] {
              stream_ = cuda::capture_stream(kDevice);
              capturing_ = true;
              wait_for_flag(released_);
            });
            failure_ = g.failure();
          } catch (const std::exception& e) {  // a capture that could not begin: the test fails
            failure_ = e.what();
            capturing_ = true;
          }
        }) {
    wait_for_flag(capturing_);
  }
  HeldCapture(const HeldCapture&) = delete;
  HeldCapture& operator=(const HeldCapture&) = delete;
  ~HeldCapture() {
    if (thread_.joinable()) end();
  }
  // The stream being captured.
  cuda::StreamHandle stream() const { return stream_; }
  // Ends the capture; whether it succeeded (failure() says why not).
  bool end() {
    released_ = true;
    thread_.join();
    return captured_;
  }
  const std::string& failure() const { return failure_; }

 private:
  std::atomic<bool> capturing_{false}, released_{false};
  std::atomic<cuda::StreamHandle> stream_{nullptr};
  bool captured_ = false;
  std::string failure_;
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace

TEST_CASE("a CUDA graph launched from another stream runs in that stream's order",
          "[cuda][runtime][graphs]") {
  const int64_t n = int64_t{1} << 20;
  const Tensor x = zeros({n}, DType::Float32, kCuda), y = zeros({n}, DType::Float32, kCuda),
               z = zeros({n}, DType::Float32, kCuda), five = full({n}, 5.0, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  cuda::Graph g;
  REQUIRE(capture_copy(g, y, x, [] {}));
  // From the default stream first: that binds the thread's capture streams when nothing did yet.
  REQUIRE(g.launch(cuda::current_stream(kDevice)));
  cuda::synchronize(kDevice);

  const cuda::StreamHandle other = cuda::create_stream(kDevice);
  const int64_t before = cuda::rerouted_graph_launches();
  // `other` busy first (256 MiB of copies), so that a graph not ordered after it would copy x
  // before x = 5 lands.
  const Tensor big = zeros({int64_t{1} << 24}, DType::Float32, kCuda),
               big_copy = zeros({int64_t{1} << 24}, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  for (int k = 0; k < 4; ++k) copy_on(other, big_copy, big);
  copy_on(other, x, five);  // x = 5 on `other`, then y = x by the graph, then z = y on `other`
  REQUIRE(g.launch(other));
  copy_on(other, z, y);
  {
    const cuda::StreamGuard on(kDevice, other);
    cuda::synchronize(kDevice);  // `other` alone: its later work waited for the graph
  }
  CHECK(cuda::rerouted_graph_launches() - before == 1);
  CHECK(bit_diff(z, five) == "");
  cuda::destroy_stream(other);
}

TEST_CASE("a device synchronisation during another thread's CUDA graph capture waits for it",
          "[cuda][runtime][graphs][threads]") {
  const Tensor x = full({4096}, 3.0, DType::Float32, kCuda),
               y = zeros({4096}, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  // A stream destroyed since: ordering after it waits for the whole device.
  const cuda::StreamHandle gone = cuda::create_stream(kDevice);
  const uint64_t serial = cuda::stream_serial(gone);
  cuda::destroy_stream(gone);

  OrderLog log;
  std::atomic<bool> capturing{false}, asking{false};
  bool captured = false, launched = false;
  std::string failure;
  std::thread capture([&] {
    cuda::set_device(kDevice);
    cuda::Graph g;
    captured = capture_copy(g, y, x, [&] {
      capturing = true;
      wait_for_flag(asking);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the other thread waits
      log.add("capture ends");
    });
    failure = g.failure();
    if (captured && g.launch(cuda::current_stream(kDevice))) {
      cuda::synchronize(kDevice);
      launched = true;
    }
  });
  wait_for_flag(capturing);
  asking = true;
  cuda::order_after(kDevice, cuda::current_stream(kDevice), gone, serial);
  log.add("device synchronised");
  capture.join();
  INFO(failure);
  CHECK(captured);
  CHECK(launched);
  CHECK(log.events() == std::vector<std::string>{"capture ends", "device synchronised"});
  CHECK(bit_diff(y, x) == "");
}

TEST_CASE("device memory freed during another thread's CUDA graph capture is freed after it",
          "[cuda][runtime][graphs][threads]") {
  const Tensor x = full({4096}, 7.0, DType::Float32, kCuda),
               y = zeros({4096}, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  Allocator& memory = allocator_for(kCuda);
  HeldCapture capture(y, x);
  {
    const Tensor scratch = zeros({int64_t{1} << 20}, DType::Float32, kCuda);
    cuda::synchronize(kDevice);
  }
  const int64_t deferred = cuda::capture_gate().deferred();
  memory.empty_cache();  // returns at once: its cudaFree is put off until the capture ends
  CHECK(cuda::capture_gate().deferred() > deferred);
  CHECK(cuda::capture_gate().pending());
  const bool captured = capture.end();
  INFO(capture.failure());
  CHECK(captured);
  CHECK_FALSE(cuda::capture_gate().pending());  // freed when it ended
}

TEST_CASE(
    "a tensor recorded on another thread's capturing stream and freed meanwhile is freed after "
    "the capture",
    "[cuda][runtime][graphs][threads]") {
  const Tensor x = full({4096}, 2.0, DType::Float32, kCuda),
               y = zeros({4096}, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  HeldCapture capture(y, x);
  const int64_t n = int64_t{1} << 18;
  Tensor t = zeros({n}, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  const void* block = t.raw_data();
  t.record_stream(capture.stream());
  const int64_t deferred = cuda::capture_gate().deferred(), pending = cuda::pending_frees();
  t = Tensor();  // its free waits for the capture: no event can be recorded on the stream now
  CHECK(cuda::capture_gate().deferred() == deferred + 1);
  CHECK(cuda::pending_frees() == pending);
  // The block is not handed out again meanwhile.
  const Tensor u = zeros({n}, DType::Float32, kCuda);
  CHECK(u.raw_data() != block);
  const bool captured = capture.end();
  INFO(capture.failure());
  CHECK(captured);
  CHECK_FALSE(cuda::capture_gate().pending());  // its free is recorded now
}

TEST_CASE("a thread's CUDA capture streams go to the next thread together",
          "[cuda][runtime][graphs][threads]") {
  cuda::StreamHandle first[2] = {}, next[2] = {};
  std::thread a([&] {
    for (int k = 0; k < 2; ++k) first[k] = cuda::capture_stream(kDevice, k);
  });
  a.join();
  std::thread b([&] {
    for (int k = 0; k < 2; ++k) next[k] = cuda::capture_stream(kDevice, k);
  });
  b.join();
  CHECK(next[0] == first[0]);
  CHECK(next[1] == first[1]);
}

TEST_CASE("a CUDA graph capture is ended on the thread that began it", "[cuda][runtime][graphs]") {
  const Tensor x = full({256}, 1.0, DType::Float32, kCuda), y = zeros({256}, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  cuda::Graph g;
  const cuda::StreamHandle s = cuda::capture_stream(kDevice);
  const cuda::StreamGuard on(kDevice, s);
  g.begin_capture(s);
  copy_on(s, y, x);
  bool refused = false;
  std::thread other([&] {
    try {
      (void)g.end_capture();
    } catch (const Error&) {
      refused = true;
    }
  });
  other.join();
  CHECK(refused);
  CHECK(cuda::capturing());
  REQUIRE(g.end_capture());  // on its own thread
  CHECK_FALSE(cuda::capturing());
}
