// The implementation descriptor: what a library that implements tdc's API says about itself.
//
// [Note: implementation descriptor]
// The conformance suite runs against whatever library is loaded as libtdc.so: the reference
// implementation, another C++ implementation of the same headers, or a mutant (`tdc mutate`).
// Each exports one C function, tdc_implementation(), returning a descriptor: its name and
// version (written into every results file) and the features it implements (a test that needs
// a feature the descriptor lacks reports NOT_SUPPORTED, never PASS). The descriptor is plain C
// so that its layout does not depend on the compiler that built the library; abi_version says
// which layout it is. `tdc run --impl LIB` puts LIB in place of libtdc.so for every test binary.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

#define TDC_IMPLEMENTATION_ABI 1

struct tdc_implementation_descriptor {
  int abi_version;              // TDC_IMPLEMENTATION_ABI
  const char* name;             // e.g. "tdc-reference"
  const char* version;          // e.g. "0.1.0"
  const char* const* features;  // null-terminated, e.g. {"fsdp2", "fsdp2.hsdp", nullptr}
};

// Exported by every implementation library (default visibility, C linkage).
const struct tdc_implementation_descriptor* tdc_implementation(void);

#ifdef __cplusplus
}
#endif
