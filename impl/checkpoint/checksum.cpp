// checksum64 / checksum_hex (tdc/checkpoint/detail/safetensors.h) on the streaming XXH64.
#include "checksum.h"

#include <string>

#include <fmt/format.h>

#include "tdc/checkpoint/detail/safetensors.h"

namespace tdc::checkpoint::detail {

uint64_t checksum64(const void* data, size_t bytes) {
  Checksum64 sum;
  sum.update(data, bytes);
  return sum.digest();
}

std::string checksum_hex(uint64_t sum) { return fmt::format("{:016x}", sum); }

}  // namespace tdc::checkpoint::detail
