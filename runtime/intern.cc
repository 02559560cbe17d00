#include "runtime/intern.h"

#include <mutex>
#include <string>

#include "absl/container/node_hash_set.h"

namespace encore {

std::string_view intern(std::string_view s) {
  // Node-based: a string never moves once inserted. Leaked on purpose: interned views outlive
  // static destruction (a node label, an event written at exit).
  static std::mutex* mu = new std::mutex();
  static auto* strings = new absl::node_hash_set<std::string>();
  std::lock_guard<std::mutex> l(*mu);
  const absl::string_view key(s.data(), s.size());
  auto it = strings->find(key);
  if (it == strings->end()) it = strings->emplace(s).first;
  return *it;
}

}  // namespace encore
