#include "catalogue.h"

#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

Mutant parse_mutant(const json& e, const std::string& where) {
  if (!e.is_object()) throw UsageError(fmt::format("{}: expected an object, got {}", where, e.dump()));
  auto str = [&](const char* field, bool required) -> std::string {
    if (!e.contains(field)) {
      if (!required) return "";
      throw UsageError(fmt::format("{}: missing field '{}'", where, field));
    }
    if (!e[field].is_string() || (required && e[field].get<std::string>().empty()))
      throw UsageError(fmt::format("{}: field '{}' must be a non-empty string, got {}", where, field, e[field].dump()));
    return e[field].get<std::string>();
  };
  Mutant m{str("id", true),
           str("component", true),
           str("file", true),
           str("find", true),
           str("replace", false),
           str("bug", true),
           {},
           str("survivor_note", false)};
  if (!e.contains("replace") || !e["replace"].is_string())
    throw UsageError(fmt::format("{}: field 'replace' must be a string", where));
  if (e.contains("suites")) {
    if (!e["suites"].is_array()) throw UsageError(fmt::format("{}: field 'suites' must be an array of names", where));
    for (const auto& s : e["suites"]) {
      if (!s.is_string()) throw UsageError(fmt::format("{}: 'suites' entry {} is not a string", where, s.dump()));
      m.suites.push_back(s.get<std::string>());
    }
  }
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
  if (!j.is_object() || j.value("schema", "") != "tdc-mutants/1" || !j.contains("mutants") || !j["mutants"].is_array())
    throw UsageError(
        fmt::format("'{}': expected {{\"schema\": \"tdc-mutants/1\", \"mutants\": [...]}}", path.string()));
  Catalogue c;
  std::set<std::string> ids;
  for (size_t i = 0; i < j["mutants"].size(); ++i) {
    std::string where = fmt::format("'{}': mutants[{}]", path.string(), i);
    Mutant m = parse_mutant(j["mutants"][i], where);
    where += " (" + m.id + ")";
    if (!ids.insert(m.id).second) throw UsageError(fmt::format("{}: id '{}' is used twice", where, m.id));
    check_against_source(m, root, where);
    c.mutants.push_back(std::move(m));
  }
  if (j.contains("smoke")) {
    for (const auto& s : j["smoke"]) {
      if (!s.is_string() || !ids.count(s.get<std::string>()))
        throw UsageError(fmt::format("'{}': smoke entry {} is not a mutant id", path.string(), s.dump()));
      c.smoke.push_back(s.get<std::string>());
    }
  }
  return c;
}

std::string mutated_source(const Mutant& m, const fs::path& root) {
  std::string text = read_text(root / m.file);
  size_t at = text.find(m.find);
  if (at == std::string::npos) throw UsageError(fmt::format("mutant {}: 'find' is not in {}", m.id, m.file));
  return text.replace(at, m.find.size(), m.replace);
}

}  // namespace tdc::cli::mutate
