// The reference implementation's descriptor ([Note: implementation descriptor]).
#include "tdc/implementation.h"

#ifndef TDC_IMPLEMENTATION_NAME
#define TDC_IMPLEMENTATION_NAME "tdc-reference"
#endif
#ifndef TDC_IMPLEMENTATION_VERSION
#define TDC_IMPLEMENTATION_VERSION "unknown"
#endif

namespace {
// What libtdc implements; grows with each component that lands (docs/plugging-in.md lists which
// conformance tests need which feature).
const char* const kFeatures[] = {"comm",
                                 "device_mesh",
                                 "dtensor",
                                 "tp",
                                 "ddp",
                                 "ddp.tp_pre_transform",
                                 "fsdp2",
                                 "fsdp2.cpu_offload",
                                 "fsdp2.mixed_precision",
                                 "fsdp2.hsdp",
                                 "fsdp2.all_gather_extensions",
                                 "fsdp1",
                                 "checkpoint",
                                 "pipelining",
                                 nullptr};
const tdc_implementation_descriptor kDescriptor{TDC_IMPLEMENTATION_ABI, TDC_IMPLEMENTATION_NAME,
                                                TDC_IMPLEMENTATION_VERSION, kFeatures};
}  // namespace

extern "C" const tdc_implementation_descriptor* tdc_implementation(void) { return &kDescriptor; }
