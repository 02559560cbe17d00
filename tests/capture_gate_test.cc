// The gate between CUDA graph captures and device-wide work (runtime/capture_gate.h), on its own:
// it is host code, so its waiting and ordering are checked on every machine, with threads. Work
// put off runs when the last capture ends, exclusive work waits for every capture to end and
// keeps new ones from beginning while it waits and runs, a thread inside a capture cannot wait
// for itself, and work the gate runs may use it again. Tagged [threads]: the ThreadSanitizer
// build runs these.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/capture_gate.h"
#include "runtime/error.h"
#include "tests/order_log.h"

using encore::cuda::CaptureGate;
using encore::testing::OrderLog;

namespace {

// Spins until `flag` is set, then gives the other thread time to reach the gate and block there
// (were the gate open, it would have gone through by then).
void settle_after(const std::atomic<bool>& flag) {
  while (!flag.load()) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

}  // namespace

TEST_CASE("work put off during captures runs when the last one ends", "[runtime][threads]") {
  CaptureGate gate;
  OrderLog log;
  gate.when_idle([&] { log.add("free 0"); });  // no capture: at once
  CHECK(log.events() == std::vector<std::string>{"free 0"});
  CHECK(gate.deferred() == 0);

  gate.enter();
  std::thread other([&] { gate.enter(); });
  other.join();
  CHECK(gate.captures() == 2);
  gate.when_idle([&] { log.add("free 1"); });
  std::thread freeing([&] { gate.when_idle([&] { log.add("free 2"); }); });
  freeing.join();  // (put off: it returned without running)
  CHECK(gate.deferred() == 2);
  log.add("first capture ends");
  gate.leave();
  CHECK(log.events().size() == 2);  // one capture is still in progress
  log.add("second capture ends");
  std::thread ending([&] { gate.leave(); });  // on another thread than the one that entered
  ending.join();
  CHECK(gate.captures() == 0);
  CHECK(log.events() == std::vector<std::string>{"free 0", "first capture ends",
                                                 "second capture ends", "free 1", "free 2"});
}

TEST_CASE("exclusive work waits for the captures in progress to end", "[runtime][threads]") {
  CaptureGate gate;
  OrderLog log;
  std::atomic<bool> asking{false};
  gate.enter();
  std::thread sync([&] {
    asking = true;
    gate.exclusive([&] { log.add("device synchronised"); });
  });
  settle_after(asking);
  log.add("capture ends");
  gate.leave();
  sync.join();
  CHECK(log.events() == std::vector<std::string>{"capture ends", "device synchronised"});

  // With no capture in progress it runs at once, on the calling thread.
  gate.exclusive([&] { log.add("again"); });
  CHECK(log.events().back() == "again");
}

TEST_CASE("no capture begins while exclusive work runs", "[runtime][threads]") {
  CaptureGate gate;
  OrderLog log;
  std::atomic<bool> working{false}, release{false}, entering{false};
  std::thread sync([&] {
    gate.exclusive([&] {
      working = true;
      while (!release.load()) std::this_thread::yield();
      log.add("device synchronised");
    });
  });
  while (!working.load()) std::this_thread::yield();
  std::thread capture([&] {
    entering = true;
    gate.enter();
    log.add("capture begins");
    gate.leave();
  });
  settle_after(entering);
  release = true;
  sync.join();
  capture.join();
  CHECK(log.events() == std::vector<std::string>{"device synchronised", "capture begins"});
}

TEST_CASE("a thread inside a capture cannot wait for the captures to end", "[runtime][threads]") {
  CaptureGate gate;
  bool ran = false;
  gate.enter();
  CHECK_THROWS_AS(gate.exclusive([&] { ran = true; }), encore::Error);
  CHECK_FALSE(ran);
  // Put-off work is not waited for: it runs once this capture ends.
  gate.when_idle([&] { ran = true; });
  CHECK_FALSE(ran);
  gate.leave();
  CHECK(ran);
  // Out of the capture, the thread may wait again.
  bool again = false;
  gate.exclusive([&] { again = true; });
  CHECK(again);
}

TEST_CASE("captures that would begin wait for exclusive work that waits", "[runtime][threads]") {
  // Without that, captures one after another could keep a device synchronisation waiting.
  CaptureGate gate;
  OrderLog log;
  std::atomic<bool> asking{false}, entering{false};
  gate.enter();
  std::thread sync([&] {
    asking = true;
    gate.exclusive([&] { log.add("device synchronised"); });
  });
  settle_after(asking);
  std::thread capture([&] {
    entering = true;
    gate.enter();
    log.add("next capture begins");
    gate.leave();
  });
  settle_after(entering);
  log.add("capture ends");
  gate.leave();
  sync.join();
  capture.join();
  CHECK(log.events() ==
        std::vector<std::string>{"capture ends", "device synchronised", "next capture begins"});
}

TEST_CASE("work the gate runs may use the gate, and work that throws stops nothing",
          "[runtime][threads]") {
  CaptureGate gate;
  OrderLog log;
  // In place, under the gate's lock (it would deadlock waiting for it).
  gate.when_idle([&] {
    gate.when_idle([&] { log.add("inner free"); });
    gate.exclusive([&] { log.add("inner synchronisation"); });
    log.add("outer free");
  });
  CHECK(log.events() ==
        std::vector<std::string>{"inner free", "inner synchronisation", "outer free"});

  gate.enter();
  gate.when_idle([] { throw std::runtime_error("a free failed"); });
  gate.when_idle([&] {
    gate.when_idle([&] { log.add("put-off inner free"); });
    log.add("put-off free");
  });
  CHECK(gate.pending());
  gate.leave();
  CHECK_FALSE(gate.pending());
  CHECK(log.events().back() == "put-off free");
  CHECK(log.events()[3] == "put-off inner free");
  // The gate is idle: exclusive work runs at once.
  bool ran = false;
  gate.exclusive([&] { ran = true; });
  CHECK(ran);
}
