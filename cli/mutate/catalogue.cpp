#include "catalogue.h"

#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tdc/json/reader.h>

#include "../cli.h"

namespace tdc::cli::mutate {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UsageError(fmt::format("cannot read '{}'", p.string()));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count_occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

using Reader = tdc::json::Reader<UsageError>;  // [Note: one JSON reader]

Mutant parse_mutant(Reader e) {
  Mutant m;
  m.id = e.string("id");
  m.component = e.string("component");
  m.file = e.string("file");
  m.find = e.string("find");
  m.replace = e.string("replace", {}, /*may_be_empty=*/true);
  m.bug = e.string("bug");
  if (e.has("suites")) m.suites = e.strings("suites");
  m.survivor_note = e.string_or("survivor_note", "");
  e.no_unknown_keys();
  return m;
}

void check_against_source(const Mutant& m, const fs::path& root, const std::string& where) {
  const fs::path file = root / m.file;
  if (m.file.rfind("impl/", 0) != 0 || file.extension() != ".cpp")
    throw UsageError(
        fmt::format("{}: file '{}' must be a .cpp under impl/ (a mutant changes the library only; "
                    "headers are compiled into the tests)",
                    where, m.file));
  if (!fs::is_regular_file(file)) throw UsageError(fmt::format("{}: file '{}' does not exist", where, file.string()));
  if (m.find == m.replace) throw UsageError(fmt::format("{}: 'find' and 'replace' are the same text", where));
  size_t n = count_occurrences(read_text(file), m.find);
  if (n != 1)
    throw UsageError(
        fmt::format("{}: 'find' occurs {} times in {} (must be exactly once; the source changed "
                    "since the mutant was written?):\n{}",
                    where, n, m.file, m.find));
}

}  // namespace

Catalogue read_catalogue(const fs::path& path, const fs::path& root) {
  json j;
  try {
    j = json::parse(read_text(path));
  } catch (const json::parse_error& e) {
    throw UsageError(fmt::format("'{}' is not valid JSON: {}", path.string(), e.what()));
  }
  Reader top(j, fmt::format("mutant catalogue '{}'", path.string()));
  top.string("schema", {"tdc-mutants/1"});
  const json& mutants = top.array("mutants");
  Catalogue c;
  std::set<std::string> ids;
  for (size_t i = 0; i < mutants.size(); ++i) {
    Mutant m = parse_mutant(top.object_at("mutants", mutants, i));
    const std::string where = fmt::format("'{}': mutants[{}] ({})", path.string(), i, m.id);
    if (!ids.insert(m.id).second) throw UsageError(fmt::format("{}: id '{}' is used twice", where, m.id));
    check_against_source(m, root, where);
    c.mutants.push_back(std::move(m));
  }
  if (top.has("smoke")) {
    c.smoke = top.strings("smoke");
    for (size_t i = 0; i < c.smoke.size(); ++i)
      if (!ids.count(c.smoke[i])) top.fail_at(top.element("smoke", i), "is not a mutant id", json(c.smoke[i]));
  }
  top.no_unknown_keys();
  return c;
}

std::string mutated_source(const Mutant& m, const fs::path& root) {
  std::string text = read_text(root / m.file);
  size_t at = text.find(m.find);
  if (at == std::string::npos) throw UsageError(fmt::format("mutant {}: 'find' is not in {}", m.id, m.file));
  return text.replace(at, m.find.size(), m.replace);
}

}  // namespace tdc::cli::mutate
