// The phase trace of a test's processes, for measuring where a suite's time goes
// (docs/bench/suite_time.md, tools/bench/phases.sh).
#pragma once

#include <string>

namespace tdc::harness {

// [Note: phase trace] With TDC_PHASES=FILE in the environment, every process of a test appends
// one line per phase boundary to FILE: "<test id> <rank> <phase> <CLOCK_MONOTONIC µs>", rank -1
// for the supervisor (the test binary's own process). One write(2) per line with O_APPEND, so the
// processes' lines never interleave. Phases, in order: the supervisor's `launch` (before it forks
// the ranks); each rank's `rank_start` (its process or thread has started), `group_start` /
// `group_end` around the world group's construction (rendezvous on the store, Gloo's connections;
// conformance::world()), `body_start` / `body_end` around the test body; the supervisor's
// `ranks_done` (every rank process reaped) and `cleaned` (temp dir removed). Without TDC_PHASES it
// does nothing.
void mark_phase(const std::string& test_id, int rank, const char* phase);

}  // namespace tdc::harness
