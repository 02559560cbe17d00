// Objects that update parameters between calls (optimizers), registered while they live, so that
// a static step traced before one was made can tell whether it holds a tensor the step read but
// did not update: a parameter group added as a new optimizer, which the replays would never run
// (they run the traced step, not the code that loops over the optimizers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace encore {

// Registers `*params` (a member of the owner, read at each query) under a new serial for as long
// as it lives; `kind` names the owner in a static step's retrace reason ("Adam"; an optimizer
// defined outside encore is "optimizer", said as "an optimizer").
class ParamUpdaterRegistration {
 public:
  ParamUpdaterRegistration(const std::vector<Tensor>* params, std::string kind);
  ~ParamUpdaterRegistration();
  ParamUpdaterRegistration(const ParamUpdaterRegistration&) = delete;
  ParamUpdaterRegistration& operator=(const ParamUpdaterRegistration&) = delete;
  // The owner's parameters were replaced (an optimizer assigned another): a new serial, as a
  // new registration's.
  void renew();
  const std::string& kind() const { return kind_; }

 private:
  const std::vector<Tensor>* params_;
  std::string kind_;
  uint64_t serial_ = 0;
};

// The serial of the newest registration (0 before the first): one atomic load.
uint64_t param_updaters_serial();
// Whether an updater registered after serial `since` holds `t` (the same TensorImpl); its kind
// then in `kind`. Takes the registry's lock.
bool param_updater_since(uint64_t since, const Tensor& t, std::string& kind);

}  // namespace encore
