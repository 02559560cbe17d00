#include "runtime/param_updaters.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <utility>

namespace encore {

namespace {

struct Registered {
  uint64_t serial;
  const std::vector<Tensor>* params;
  const std::string* kind;
};

std::mutex g_mu;
std::vector<Registered> g_registered;  // guarded by g_mu, in serial order
std::atomic<uint64_t> g_serial{0};     // the newest serial; written under g_mu

uint64_t add(const std::vector<Tensor>* params, const std::string* kind) {
  std::lock_guard<std::mutex> l(g_mu);
  const uint64_t serial = g_serial.load(std::memory_order_relaxed) + 1;
  g_registered.push_back({serial, params, kind});
  g_serial.store(serial, std::memory_order_release);
  return serial;
}

void remove(uint64_t serial) {
  std::lock_guard<std::mutex> l(g_mu);
  const auto it = std::lower_bound(g_registered.begin(), g_registered.end(), serial,
                                   [](const Registered& r, uint64_t s) { return r.serial < s; });
  if (it != g_registered.end() && it->serial == serial) g_registered.erase(it);
}

}  // namespace

ParamUpdaterRegistration::ParamUpdaterRegistration(const std::vector<Tensor>* params,
                                                   std::string kind)
    : params_(params), kind_(std::move(kind)), serial_(add(params_, &kind_)) {}

ParamUpdaterRegistration::~ParamUpdaterRegistration() {
  remove(serial_);
}

void ParamUpdaterRegistration::renew() {
  remove(serial_);
  serial_ = add(params_, &kind_);
}

uint64_t param_updaters_serial() {
  return g_serial.load(std::memory_order_acquire);
}

bool param_updater_since(uint64_t since, const Tensor& t, std::string& kind) {
  if (!t.defined()) return false;
  std::lock_guard<std::mutex> l(g_mu);
  const auto first = std::upper_bound(g_registered.begin(), g_registered.end(), since,
                                      [](uint64_t s, const Registered& r) { return s < r.serial; });
  for (auto it = first; it != g_registered.end(); ++it)
    for (const Tensor& p : *it->params)
      if (p.impl() == t.impl()) {
        kind = *it->kind;
        return true;
      }
  return false;
}

}  // namespace encore
