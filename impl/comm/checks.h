// Cross-rank argument checks (see [Note: cross-rank argument checks] in checks.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"

namespace tdc::comm::detail {

enum class Coll : int64_t { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, Barrier };
const char* coll_name(Coll c);

struct CheckArgs {
  Coll op;
  at::Tensor tensor;  // the tensor whose dtype and shape must agree (may be undefined)
  std::optional<ReduceOp> reduce;
  int64_t root = -1;
  bool ignore_dim0 = false;     // all_to_all_single with explicit split sizes
  std::vector<int64_t> splits;  // all_to_all_single: n input splits, then n output splits
  std::string local_error;      // this rank's own argument error, if any
};

// Throws (on every rank alike) when ranks disagree or any rank's arguments are bad. With checks
// off, only throws this rank's local error.
void agree(const ProcessGroup& g, const CheckArgs& args);

// [Note: a small collective rides with its check] (checks.cpp): what a collective offers to send
// inside its check's exchange. `payload(dst)` is what this rank sends to rank `dst` of the group:
// a contiguous CPU tensor (undefined: nothing), never called for this rank itself.
struct Ride {
  std::function<at::Tensor(int dst)> payload;
};
// Up to this many bytes per destination ride along.
constexpr int64_t kRideBytes = 4096;

// The bytes every other rank sent to this one inside the check's exchange.
class Ridden {
 public:
  Ridden(at::Tensor frames, int64_t frame_words, int64_t payload_word, int first_rank)
      : frames_(std::move(frames)), frame_words_(frame_words), payload_word_(payload_word), first_rank_(first_rank) {}
  // The start of what `src` (not this rank) sent to this rank; as many bytes as it sent.
  const uint8_t* from(int src) const;
  // Copies what `src` sent into `dst`, a contiguous CPU tensor of exactly as many bytes as `src`
  // said it sent in its fingerprint (else throws).
  void copy_from(int src, const at::Tensor& dst) const;

 private:
  at::Tensor frames_;  // int64 words: the frames received, from rank first_rank_ on
  int64_t frame_words_, payload_word_;
  int first_rank_;
};

// agree() whose exchange carries `ride` too: returns what the others sent when every rank's
// payload rode (the collective is then done but for its local part), nothing when any did not
// (then every rank runs the collective as usual). Every rank gets the same answer.
std::optional<Ridden> agree(const ProcessGroup& g, const CheckArgs& args, const Ride& ride);

bool checks_enabled();
void tls_checks_set(bool enabled);
std::string describe(const at::Tensor& t);       // "float32[4, 8]"
std::string group_label(const ProcessGroup& g);  // "group 'world' (size 4)"

}  // namespace tdc::comm::detail
