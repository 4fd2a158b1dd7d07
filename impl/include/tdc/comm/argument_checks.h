// The cross-rank argument checks of tdc::comm: before each collective the ranks exchange a
// fingerprint of its arguments (op, dtype, shape), so ranks that disagree get an error naming the
// op, the group and every rank's tensor instead of a hang. On by default; TDC_COMM_CHECKS=0 turns
// them off for the process.
#pragma once

#include <cstdint>

namespace tdc::comm {

// Turn the cross-rank argument checks on or off for the calling thread (default from
// TDC_COMM_CHECKS, on unless "0").
void set_argument_checks(bool enabled);
bool argument_checks();

// What the calling thread's checks did: how many exchanges they made, and how many of those carried
// the collective's data as well, so that the collective needed no exchange of its own ([Note: a
// small collective rides with its check], comm/checks.cpp).
struct ArgumentCheckCounts {
  int64_t checks = 0;
  int64_t rides = 0;
};
ArgumentCheckCounts argument_check_counts();

// Sets the calling thread's checks for the scope and restores them after. DDP's buckets and FSDP's
// groups turn them off for collectives whose arguments an earlier check already proved equal on
// every rank ([Note: bucket all-reduces skip the argument checks] in ddp/reducer.cpp, [Note: FSDP's
// collectives skip the argument checks after the first] in fsdp/collectives.cpp).
class ScopedArgumentChecks {
 public:
  explicit ScopedArgumentChecks(bool enabled) : previous_(argument_checks()) { set_argument_checks(enabled); }
  ~ScopedArgumentChecks() { set_argument_checks(previous_); }
  ScopedArgumentChecks(const ScopedArgumentChecks&) = delete;
  ScopedArgumentChecks& operator=(const ScopedArgumentChecks&) = delete;

 private:
  bool previous_;
};

}  // namespace tdc::comm
