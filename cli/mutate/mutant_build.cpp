#include "mutant_build.h"

#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "../cli.h"
#include "../process.h"

namespace tdc::cli::mutate {

namespace fs = std::filesystem;

namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` with sh in `dir`; the wait status and the merged output.
Captured run_in(const fs::path& dir, const std::string& command, double timeout_s) {
  return capture({"sh", "-c", "cd " + shell_quote(dir.string()) + " && " + command}, true, timeout_s);
}

void replace_once(std::string& s, const std::string& from, const std::string& to, const std::string& what) {
  size_t at = s.find(from);
  if (at == std::string::npos)
    throw UsageError(fmt::format("mutate: the link line of libtdc lacks {} '{}'", what, from));
  s.replace(at, from.size(), to);
}

// "-o OBJ -c SRC" of a compile line: OBJ.
std::string object_of(const std::string& compile_line) {
  static const std::regex re(R"( -o (\S+) -c \S+\s*$)");
  std::smatch m;
  if (!std::regex_search(compile_line, m, re)) throw UsageError("mutate: unexpected compile line: " + compile_line);
  return m[1];
}

}  // namespace

MutantBuilder::MutantBuilder(fs::path build, fs::path source_root)
    : build_(std::move(build)), root_(std::move(source_root)) {
  Captured c = capture({"ninja", "-C", build_.string(), "-t", "commands", "tdc"}, false, 60);
  if (!WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0 || c.output.empty())
    throw UsageError(fmt::format("mutate: 'ninja -C {} -t commands tdc' failed ({}): is it a configured tdc build?",
                                 build_.string(), describe_exit(c.status)));
  commands_ = c.output;
  std::istringstream in(commands_);
  for (std::string line; std::getline(in, line);)
    if (line.find(" -o libtdc.so ") != std::string::npos) link_ = line;
  if (link_.empty()) throw UsageError("mutate: ninja lists no command that links libtdc.so");
  if (!fs::is_regular_file(build_ / "libtdc.so"))
    throw UsageError(fmt::format("mutate: {} has no libtdc.so yet: build it first (./tdc build)", build_.string()));
}

namespace {

// The unity TU's line that includes `source` (CMake writes `#include "<absolute path>"`).
std::string unity_include(const fs::path& source) { return "#include \"" + source.string() + "\""; }

bool unity_includes(const fs::path& unity, const fs::path& source) {
  std::ifstream in(unity);
  for (std::string line; std::getline(in, line);)
    if (line == unity_include(source)) return true;
  return false;
}

}  // namespace

MutantBuilder::Compile MutantBuilder::compile_of(const fs::path& source) const {
  static const std::regex compiles(R"( -c (\S+)\s*$)");
  std::istringstream in(commands_);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, compiles)) continue;
    const fs::path compiled = m[1].str();
    if (compiled == source) return {line, compiled};
    if (compiled.extension() == ".cxx" && compiled.parent_path().filename() == "Unity" &&
        unity_includes(compiled, source))
      return {line, compiled};
  }
  throw UsageError(fmt::format(
      "mutate: no command of libtdc compiles '{}' (is it one of impl/CMakeLists.txt's sources?)", source.string()));
}

MutantBuilder::Built MutantBuilder::build(const Mutant& m, const fs::path& dir) const {
  auto t0 = std::chrono::steady_clock::now();
  Built out;
  fs::create_directories(dir / "src");
  const fs::path original = fs::absolute(root_ / m.file).lexically_normal();
  const fs::path copy = dir / "src" / original.filename();
  std::ofstream(copy, std::ios::binary) << mutated_source(m, root_);

  // The mutated file and the descriptor, each compiled like the original (dependency-file flags
  // dropped: nothing tracks these objects).
  static const std::regex depfile(R"( -MD -MT \S+ -MF \S+)");
  auto recompile = [&](const fs::path& source, const fs::path& replacement, const std::string& extra) {
    const Compile compile = compile_of(source);
    fs::path input = replacement;
    if (compile.compiled != source) {  // a unity TU: its copy includes the replacement instead
      input = dir / compile.compiled.filename();
      std::ifstream unity(compile.compiled);
      std::ofstream unity_copy(input);
      for (std::string line; std::getline(unity, line);)
        unity_copy << (line == unity_include(source) ? unity_include(replacement) : line) << "\n";
    }
    std::string line = std::regex_replace(compile.line, depfile, "");
    const std::string object = object_of(line);
    const fs::path new_object = dir / (input.filename().string() + ".o");
    replace_once(line, " -o " + object + " -c " + compile.compiled.string(),
                 fmt::format(" -iquote {} {} -o {} -c {}", shell_quote(source.parent_path().string()), extra,
                             shell_quote(new_object.string()), shell_quote(input.string())),
                 "object");
    Captured c = run_in(build_, line, 900);
    out.log += c.output;
    if (c.timed_out || !WIFEXITED(c.status) || WEXITSTATUS(c.status) != 0) return std::string();
    return object + "|" + new_object.string();
  };
  std::string swapped = recompile(original, copy, "");
  const fs::path descriptor = (root_ / "impl" / "implementation.cpp").lexically_normal();
  std::string swapped_descriptor =
      swapped.empty()
          ? ""
          : recompile(fs::absolute(descriptor), fs::absolute(descriptor),
                      shell_quote("-DTDC_IMPLEMENTATION_NAME=\"tdc-mutant\"") + " -UTDC_IMPLEMENTATION_VERSION " +
                          shell_quote("-DTDC_IMPLEMENTATION_VERSION=\"" + m.id + "\""));
  if (!swapped.empty() && !swapped_descriptor.empty()) {
    std::string link = link_;
    out.library = dir / "libtdc.so";
    replace_once(link, " -o libtdc.so ", " -o " + shell_quote(out.library.string()) + " ", "output");
    for (const std::string& pair : {swapped, swapped_descriptor}) {
      size_t bar = pair.find('|');
      replace_once(link, " " + pair.substr(0, bar) + " ", " " + shell_quote(pair.substr(bar + 1)) + " ", "object");
    }
    Captured c = run_in(build_, link, 600);
    out.log += c.output;
    out.ok = !c.timed_out && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace tdc::cli::mutate
