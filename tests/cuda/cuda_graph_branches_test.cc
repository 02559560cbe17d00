// cuda::Graph with branches (runtime/cuda.h), on its own: work captured on a stream and three
// branches, ordered by marks, runs in the marks' order at every launch, and the launch ends once
// every branch's work has (a chain of device copies across the four streams, whose last value
// is the first one's only when every order held). A capture abandoned midway leaves the branches
// usable, and the number of graph streams is checked.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "encore/encore.h"
#include "runtime/cuda.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

using namespace encore;
using namespace encore::testing;

namespace {
constexpr int kDevice = 0;
}  // namespace

TEST_CASE("a CUDA graph on a stream and three branches runs in the order its marks say",
          "[cuda][runtime][graphs]") {
  const int64_t n = int64_t{1} << 22;  // 16 MiB a buffer: copies long enough to overlap
  const Tensor src = zeros({n}, DType::Float32, kCuda);
  std::vector<Tensor> t;  // a, b, c, d, e
  for (int k = 0; k < 5; ++k) t.push_back(zeros({n}, DType::Float32, kCuda));
  const Tensor &a = t[0], &b = t[1], &c = t[2], &d = t[3], &e = t[4];
  cuda::synchronize(kDevice);
  cuda::StreamHandle s[cuda::kCaptureStreams];
  for (int k = 0; k < cuda::kCaptureStreams; ++k) s[k] = cuda::capture_stream(kDevice, k);

  cuda::Graph g;
  {
    const cuda::StreamGuard on(kDevice, s[0]);
    const cuda::StreamHandle branches[] = {s[1], s[2], s[3]};
    g.begin_capture(s[0], branches, /*marks=*/3);
    copy_on(s[0], a, src);  // a = src
    g.mark(0, s[0]);
    g.after(s[1], 0);
    copy_on(s[1], b, a);  // b = a, after a
    g.mark(1, s[1]);
    g.after(s[2], 0);
    copy_on(s[2], c, a);  // c = a, beside b
    g.after(s[3], 1);
    copy_on(s[3], d, b);  // d = b, after b
    g.mark(2, s[3]);
    g.after(s[0], 2);
    copy_on(s[0], e, d);  // e = d, after d
    REQUIRE(g.end_capture());
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> value(-1, 1);
  std::vector<float> host(static_cast<size_t>(n));
  for (int launch = 0; launch < 4; ++launch) {
    INFO("launch " << launch);
    for (float& v : host) v = value(rng);
    cuda::copy_bytes(src.raw_data(), kCuda, host.data(), Device::cpu(), src.nbytes());
    REQUIRE(g.launch(cuda::current_stream(kDevice)));
    cuda::synchronize(kDevice);  // the launch's stream: every branch's copies are done
    for (const Tensor& x : t) CHECK(bit_diff(x, src) == "");
  }
}

TEST_CASE("a CUDA graph capture with branches abandoned midway leaves its streams usable",
          "[cuda][runtime][graphs]") {
  const Tensor x = full({1024}, 2.0, DType::Float32, kCuda),
               y = zeros({1024}, DType::Float32, kCuda);
  cuda::synchronize(kDevice);
  const cuda::StreamHandle s0 = cuda::capture_stream(kDevice, 0),
                           s1 = cuda::capture_stream(kDevice, 1);
  {
    cuda::Graph g;
    const cuda::StreamGuard on(kDevice, s0);
    const cuda::StreamHandle branches[] = {s1};
    g.begin_capture(s0, branches, /*marks=*/1);
    copy_on(s1, y, x);
    g.mark(0, s1);
    CHECK_THROWS_AS(g.mark(1, s1), Error);  // not one of its marks
    g.abort_capture();
    CHECK_FALSE(cuda::capturing());
  }
  copy_on(s1, y, x);  // runs now, on a stream no longer capturing
  {
    const cuda::StreamGuard on(kDevice, s1);
    cuda::synchronize(kDevice);
  }
  CHECK(bit_diff(y, x) == "");
}

TEST_CASE("graph streams are 1 to 4", "[cuda][runtime][graphs]") {
  const int previous = cuda::graph_streams();
  CHECK((previous >= 1 && previous <= cuda::kCaptureStreams));
  CHECK(cuda::set_graph_streams(3) == previous);
  CHECK(cuda::graph_streams() == 3);
  CHECK_THROWS_AS(cuda::set_graph_streams(0), Error);
  CHECK_THROWS_AS(cuda::set_graph_streams(cuda::kCaptureStreams + 1), Error);
  CHECK(cuda::set_graph_streams(previous) == 3);
}
