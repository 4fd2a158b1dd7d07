// Builds a mutant as an alternative implementation library: libtdc's own objects, with the
// mutated source file and the descriptor recompiled, linked into OUT/libtdc.so.
#pragma once

#include <filesystem>
#include <string>

#include "catalogue.h"

namespace tdc::cli::mutate {

// [Note: a mutant costs one compile and one link] The build directory's ninja knows the exact
// command that compiles each libtdc source and the one that links libtdc.so. A mutant reuses
// them: the mutated copy of one file is compiled with the same flags (-iquote keeps its
// "local.h" includes resolving to the original directory), the descriptor is recompiled with
// the name "tdc-mutant" and the mutant's id as version, and the link line runs with those two
// objects swapped and another output. In a unity build ([Note: unity builds]) the file is part of
// a unity TU: a copy of that TU that includes the mutated copy in its place is compiled instead.
// Nothing in the source tree or the build directory changes.
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
  // The command that compiles `source` into libtdc, and what it compiles: `source` itself or the
  // unity TU that includes it.
  struct Compile {
    std::string line;
    std::filesystem::path compiled;
  };
  Compile compile_of(const std::filesystem::path& source) const;
  std::filesystem::path build_, root_;
  std::string commands_;  // ninja's command list for libtdc
  std::string link_;
};

}  // namespace tdc::cli::mutate
