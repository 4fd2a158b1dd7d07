// Builds a mutant as an alternative implementation library: libtdc's own objects, with the
// mutated source file and the descriptor recompiled, linked into OUT/libtdc.so.
#pragma once

#include <filesystem>
#include <string>

#include "catalogue.h"

namespace tdc::cli::mutate {

// [Note: a mutant costs one compile and one link] The build directory's ninja knows the exact
// command that compiles each libtdc source and the one that links libtdc.so. A mutant reuses
// them: the mutated copy of one file is compiled with the same flags (and the same precompiled
// header; -iquote keeps its "local.h" includes resolving to the original directory), the
// descriptor is recompiled with the name "tdc-mutant" and the mutant's id as version, and the
// link line runs with those two objects swapped and another output. Nothing in the source tree
// or the build directory changes.
class MutantBuilder {
 public:
  // Reads the commands from `ninja -C build -t commands tdc`; throws UsageError when the build
  // has no libtdc (build it first) or a command cannot be found.
  MutantBuilder(std::filesystem::path build, std::filesystem::path source_root);

  struct Built {
    bool ok = false;
    std::filesystem::path library;  // dir/libtdc.so
    std::string log;                // the compiler's output when it failed
    double seconds = 0;
  };
  // Builds `m` into `dir` (created).
  Built build(const Mutant& m, const std::filesystem::path& dir) const;

 private:
  std::string compile_command(const std::string& source_abs) const;
  std::filesystem::path build_, root_;
  std::string commands_;  // ninja's command list for libtdc
  std::string link_;
};

}  // namespace tdc::cli::mutate
