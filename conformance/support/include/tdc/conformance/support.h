// Glue between the harness (which knows ranks, stores and run settings) and tdc's
// implementation (which knows process groups). Conformance and unit tests call world() first.
#pragma once

#include "tdc/comm/process_group.h"

namespace tdc::conformance {

// The default process group of the calling rank, created on first use in a test from the harness
// context: its store, rank, world size, backend (loading --tdc_backend_lib first) and device.
comm::GroupPtr world();

}  // namespace tdc::conformance
