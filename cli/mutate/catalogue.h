// The mutant catalogue (conformance/mutants.json): realistic implementation bugs, each an exact
// find -> replace in one source file of libtdc (docs/reports.md, "Mutation score").
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace tdc::cli::mutate {

struct Mutant {
  std::string id;         // kebab-case, unique
  std::string component;  // fsdp2, ddp, dtensor, tp, checkpoint, pipelining, comm, mesh, nn
  std::string file;       // relative to the source root; a .cpp of impl/ (never a header)
  std::string find;       // occurs exactly once in file
  std::string replace;
  std::string bug;                  // what a porter got wrong
  std::vector<std::string> suites;  // test binaries most likely to kill it, first to run
  std::string survivor_note;        // why it survives (equivalent mutant, or the gap), if it does
};

struct Catalogue {
  std::vector<Mutant> mutants;
  std::vector<std::string> smoke;  // ids of the CTest smoke
};

// Reads and validates the catalogue against the sources under `root`: every field present and a
// string, ids unique, each file a .cpp under impl/, each find occurring exactly once and differing
// from its replace, smoke ids known. Throws UsageError naming the file, the mutant and the field.
Catalogue read_catalogue(const std::filesystem::path& path, const std::filesystem::path& root);

// The source of `m.file` with the mutation applied.
std::string mutated_source(const Mutant& m, const std::filesystem::path& root);

}  // namespace tdc::cli::mutate
