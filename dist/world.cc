#include "dist/world.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "dist/backend.h"
#include "runtime/comm_progress.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace encore::dist {
namespace {

constexpr double kDefaultTimeout = 300;
// Polls between two looks at the clock (and a yield, so a waiting rank leaves its core to a
// process sharing it).
constexpr int kPollsPerCheck = 16;

std::once_flag g_init;
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_finalized{false};
std::atomic<bool> g_broken{false};
Membership g_world;
std::atomic<double> g_timeout{kDefaultTimeout};
std::atomic<bool> g_progress{true};

double timeout_from_environment() {
  const char* env = std::getenv("ENCORE_DIST_TIMEOUT");
  if (env == nullptr || *env == '\0') return kDefaultTimeout;
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  ENCORE_CHECK(end != env && *end == '\0' && s > 0, "dist: ENCORE_DIST_TIMEOUT='", env,
               "' is not a positive number of seconds");
  return s;
}

// Between kernels (runtime/comm_progress.h), while this thread has requests in flight.
void progress_between_kernels() {
  if (g_progress.load(std::memory_order_relaxed)) progress();
}

void check_usable(std::string_view what) {
  ENCORE_CHECK(g_initialized.load(std::memory_order_acquire), "dist: ", what,
               " before dist::init()");
  ENCORE_CHECK(!g_broken.load(std::memory_order_relaxed), "dist: ", what, " on ", rank_name(),
               ", whose world is broken by an earlier failure (a peer died or stalled); end the "
               "process");
  ENCORE_CHECK(!g_finalized.load(std::memory_order_relaxed), "dist: ", what,
               " after dist::finalize()");
}

}  // namespace

void init() {
  std::call_once(g_init, [] {
    g_timeout.store(timeout_from_environment());
    g_progress.store(env::flag("ENCORE_DIST_PROGRESS", true));
    g_world = host::join();
    comm_progress::set_function(&progress_between_kernels);
    g_initialized.store(true, std::memory_order_release);
    std::atexit(finalize);
  });
}

bool initialized() {
  return g_initialized.load(std::memory_order_acquire);
}
int rank() {
  return g_world.rank;
}
int world_size() {
  return g_world.size;
}

void finalize() {
  if (!initialized() || g_finalized.exchange(true)) return;
  device::shutdown();
  host::leave(!g_broken.load());
}

void set_timeout(double seconds) {
  ENCORE_CHECK(seconds > 0, "dist::set_timeout: ", seconds, " is not a positive number of seconds");
  g_timeout.store(seconds);
}
double timeout() {
  return g_timeout.load();
}

void set_progress_enabled(bool on) {
  g_progress.store(on);
}
bool progress_enabled() {
  return g_progress.load();
}

bool broken() {
  return g_broken.load();
}

void throw_broken(std::string message) {
  g_broken.store(true);
  throw Error(std::move(message));
}

std::string rank_name() {
  return cat("rank ", g_world.rank, " of ", g_world.size);
}

void wait_for(absl::FunctionRef<bool()> done, absl::FunctionRef<std::string()> what) {
  if (done()) return;
  using Clock = std::chrono::steady_clock;
  const double limit = timeout();
  const Clock::time_point begin = Clock::now();
  const Clock::time_point deadline =
      begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  for (int polls = 1;; ++polls) {
    if (done()) return;
    if (polls % kPollsPerCheck == 0) {
      if (Clock::now() > deadline)
        throw_broken(
            cat("dist: ", rank_name(), " waited ", limit, " s for ", what(),
                "; a peer process died or stalls (dist::set_timeout, ENCORE_DIST_TIMEOUT)"));
      std::this_thread::yield();
    }
  }
}

void barrier() {
  check_usable("barrier");
  const int slot = host::start_barrier();
  wait_for([slot] { return host::test(slot); }, [] { return std::string("a barrier"); });
}

void broadcast(const BufferView& buffer, Device device, int root) {
  check_usable("broadcast");
  ENCORE_CHECK(root >= 0 && root < g_world.size, "dist::broadcast: root ", root,
               " is not a rank of a world of ", g_world.size);
  if (g_world.size == 1) return;
  if (device.type == DeviceType::CUDA) {
    device::broadcast(buffer, device.index, root, g_world);
    return;
  }
  const int slot =
      host::start_broadcast(buffer.data, buffer.numel() * itemsize(buffer.dtype), root);
  wait_for(
      [slot] { return host::test(slot); },
      [&] { return cat("a broadcast of ", buffer.shape, " ", buffer.dtype, " from rank ", root); });
}

int64_t start_all_reduce(const BufferView& buffer, Device device, ReduceOp op) {
  check_usable("all_reduce");
  if (g_world.size == 1) return -1;
  if (device.type == DeviceType::CUDA) {
    device::start_all_reduce(buffer, device.index, op, g_world);
    return -1;
  }
  return host::start_all_reduce(buffer.data, buffer.numel(), buffer.dtype, op);
}

void wait_all_reduce(int64_t slot, const BufferView& buffer, Device device) {
  if (g_world.size == 1) return;
  check_usable("all_reduce");
  if (device.type == DeviceType::CUDA) {
    device::wait_all_reduce(device.index);
    return;
  }
  const int s = static_cast<int>(slot);
  wait_for([s] { return host::test(s); },
           [&] { return cat("an all-reduce of ", buffer.shape, " ", buffer.dtype); });
}

void progress() {
  if (g_world.size > 1 && !g_broken.load(std::memory_order_relaxed)) host::progress();
}

}  // namespace encore::dist
