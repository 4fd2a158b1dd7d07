// Reading tdc-parity/1 files.
#include "report/parity.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace tdc::cli {

namespace {

using nlohmann::json;

// Field access with errors naming the file and the field path.
struct Fields {
  const std::string& file;
  const json& j;
  std::string path;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw std::runtime_error(
        fmt::format("parity file '{}': {}{}{}: {}", file, path, path.empty() ? "" : ".", key, what));
  }
  const json* get(const std::string& key, bool required) const {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) fail(key, "missing field");
      return nullptr;
    }
    return &j[key];
  }
  std::string str(const std::string& key, bool required = false) const {
    const json* v = get(key, required);
    if (!v) return "";
    if (!v->is_string()) fail(key, fmt::format("expected a string, got {}", v->dump()));
    return v->get<std::string>();
  }
  double num(const std::string& key, bool required = false) const {
    const json* v = get(key, required);
    if (!v) return 0;
    if (!v->is_number()) fail(key, fmt::format("expected a number, got {}", v->dump()));
    return v->get<double>();
  }
  std::vector<double> numbers(const std::string& key) const {
    const json* v = get(key, false);
    std::vector<double> out;
    if (!v) return out;
    if (!v->is_array()) fail(key, fmt::format("expected an array of numbers, got {}", v->dump().substr(0, 80)));
    for (size_t i = 0; i < v->size(); ++i) {
      const json& x = (*v)[i];
      if (x.is_null())
        out.push_back(std::numeric_limits<double>::quiet_NaN());
      else if (x.is_number())
        out.push_back(x.get<double>());
      else
        fail(fmt::format("{}[{}]", key, i), fmt::format("expected a number or null, got {}", x.dump()));
    }
    return out;
  }
  Fields object(const std::string& key) const {
    const json* v = get(key, false);
    static const json kEmpty = json::object();
    if (v && !v->is_object()) fail(key, fmt::format("expected an object, got {}", v->dump().substr(0, 80)));
    return Fields{file, v ? *v : kEmpty, path.empty() ? key : path + "." + key};
  }
};

ParityScenario read_scenario(const Fields& f) {
  ParityScenario s;
  s.name = f.str("name", true);
  s.description = f.str("description");
  s.recipe = f.str("recipe");
  s.world_size = static_cast<int>(f.num("world_size"));
  Fields tol = f.object("tolerance");
  s.rtol = tol.num("rtol");
  s.atol = tol.num("atol");
  s.tolerance_why = tol.str("why");
  s.verdict = f.str("verdict", true);
  if (s.verdict != "PASS" && s.verdict != "FAIL" && s.verdict != "ERROR" && s.verdict != "NOT_SUPPORTED")
    f.fail("verdict", fmt::format("must be PASS, FAIL, ERROR or NOT_SUPPORTED, got '{}'", s.verdict));
  s.message = f.str("message");
  Fields loss = f.object("loss"), grad = f.object("grad_norm");
  s.loss_tdc = loss.numbers("tdc");
  s.loss_pytorch = loss.numbers("pytorch");
  s.grad_norm_tdc = grad.numbers("tdc");
  s.grad_norm_pytorch = grad.numbers("pytorch");
  s.max_rel_diff_per_step = f.numbers("max_rel_diff_per_step");
  if (f.get("max_param_rel_diff", false)) {
    s.max_param_rel_diff = f.num("max_param_rel_diff");
    s.has_max_param_rel_diff = true;
  }
  return s;
}

}  // namespace

ParityRun read_parity(const std::filesystem::path& file) {
  const std::string name = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read parity file '{}'", name));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(fmt::format("parity file '{}' is not valid JSON: {}", name, e.what()));
  }
  if (!j.is_object()) throw std::runtime_error(fmt::format("parity file '{}': expected a JSON object", name));
  Fields top{name, j, ""};
  if (std::string schema = top.str("schema", true); schema != kParitySchema)
    top.fail("schema", fmt::format("'{}' is not supported (this tdc reads '{}')", schema, kParitySchema));
  ParityRun run;
  run.source = file;
  run.created = top.str("created");
  if (const json* m = top.get("machine", false); m && m->is_object())
    for (const auto& [k, v] : m->items()) run.machine.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
  const json* scenarios = top.get("scenarios", true);
  if (!scenarios->is_array()) top.fail("scenarios", "expected an array");
  for (size_t i = 0; i < scenarios->size(); ++i) {
    const json& s = (*scenarios)[i];
    std::string path = fmt::format("scenarios[{}]", i);
    if (!s.is_object()) throw std::runtime_error(fmt::format("parity file '{}': {}: expected an object", name, path));
    run.scenarios.push_back(read_scenario(Fields{name, s, path}));
  }
  return run;
}

}  // namespace tdc::cli
