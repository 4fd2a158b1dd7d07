// `tdc run --impl LIB`: the conformance binaries run against LIB in place of libtdc.so.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace tdc::cli {

// What an implementation library's descriptor says ([Note: implementation descriptor]).
struct ImplementationDescriptor {
  std::string name;
  std::string version;
  std::vector<std::string> features;
};

// Opens LIB, calls its tdc_implementation() and copies the descriptor. Throws UsageError naming
// the library and what is wrong (not a file, does not load, no descriptor, another abi_version).
ImplementationDescriptor read_descriptor(const std::filesystem::path& lib);

// [Note: an implementation in place of libtdc.so] The test binaries need "libtdc.so" (DT_NEEDED)
// and find it through their RUNPATH, which LD_LIBRARY_PATH precedes. This makes `dir`/libtdc.so
// a link to LIB and puts `dir` first in LD_LIBRARY_PATH of this process, so every binary, and
// every rank it starts, loads LIB. Returns LIB's descriptor.
ImplementationDescriptor use_implementation(const std::filesystem::path& lib, const std::filesystem::path& dir);

}  // namespace tdc::cli
