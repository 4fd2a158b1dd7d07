// What tdc throws for a bad checkpoint or a state dict that does not fit: one type, so callers can
// tell "this checkpoint is unusable" from programming errors. Messages name the file, the key and
// the values involved. In libtdc's base because FSDP1's state-dict loading throws it too; users
// know it as tdc::checkpoint::CheckpointError (tdc/checkpoint/errors.h).
#pragma once

#include <stdexcept>
#include <string>

namespace tdc::core {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tdc::core
