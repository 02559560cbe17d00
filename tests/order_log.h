// What happened, in the order it happened, from any thread: the tests of waiting and ordering
// between threads record events here and compare the sequence.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace encore::testing {

class OrderLog {
 public:
  void add(std::string what) {
    const std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(what));
  }
  std::vector<std::string> events() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> events_;
};

}  // namespace encore::testing
