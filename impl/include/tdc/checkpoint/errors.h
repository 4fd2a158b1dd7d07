// What tdc::checkpoint throws for a bad checkpoint or a state dict that does not fit: one type,
// so callers can tell "this checkpoint is unusable" from programming errors. Messages name the
// file, the key and the values involved.
#pragma once

#include <stdexcept>
#include <string>

namespace tdc::checkpoint {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tdc::checkpoint
