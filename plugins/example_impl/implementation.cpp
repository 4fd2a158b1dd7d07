// An example of a second implementation library for `tdc run --impl` (docs/plugging-in.md): it
// is libtdc's code linked with this descriptor instead of the reference's. It declares fewer
// features, so the conformance tests that need the missing ones report NOT_SUPPORTED, and the
// results carry its name. A real implementation exports the same descriptor from its own code.
#include "tdc/implementation.h"

namespace {
const char* const kFeatures[] = {
    "comm",       "device_mesh", "dtensor",    "tp",   "ddp", "ddp.tp_pre_transform", "fsdp2", "fsdp2.mixed_precision",
    "fsdp2.hsdp", "checkpoint",  "pipelining", nullptr};  // no fsdp2.cpu_offload, no fsdp2.all_gather_extensions
const tdc_implementation_descriptor kDescriptor{TDC_IMPLEMENTATION_ABI, "example-impl", "0.1", kFeatures};
}  // namespace

extern "C" const tdc_implementation_descriptor* tdc_implementation(void) { return &kDescriptor; }
