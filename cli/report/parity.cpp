// Reading tdc-parity/1 files.
#include "report/parity.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tdc/json/reader.h>

namespace tdc::cli {

namespace {

using nlohmann::json;

using Reader = tdc::json::Reader<std::runtime_error>;  // [Note: one JSON reader]

// A list of numbers in which null stands for NaN (JSON has no NaN); absent: empty.
std::vector<double> numbers_or_nan(Reader& r, const std::string& key) {
  const json& a = r.array_or_empty(key, "must be a list of numbers");
  std::vector<double> out;
  for (size_t i = 0; i < a.size(); ++i)
    out.push_back(a[i].is_null() ? std::numeric_limits<double>::quiet_NaN()
                                 : r.number_value(r.element(key, i), a[i], -std::numeric_limits<double>::infinity()));
  return out;
}

ParityScenario read_scenario(Reader f) {
  ParityScenario s;
  s.name = f.string("name");
  s.description = f.string_or("description", "");
  s.recipe = f.string_or("recipe", "");
  s.world_size = static_cast<int>(f.integer_or("world_size", 0, 0, std::numeric_limits<int>::max()));
  Reader tol = f.object_or_empty("tolerance");
  s.rtol = tol.number_or("rtol", 0);
  s.atol = tol.number_or("atol", 0);
  s.tolerance_why = tol.string_or("why", "");
  s.verdict = f.string("verdict", {"PASS", "FAIL", "ERROR", "NOT_SUPPORTED"});
  s.message = f.string_or("message", "");
  Reader loss = f.object_or_empty("loss"), grad = f.object_or_empty("grad_norm");
  s.loss_tdc = numbers_or_nan(loss, "tdc");
  s.loss_pytorch = numbers_or_nan(loss, "pytorch");
  s.grad_norm_tdc = numbers_or_nan(grad, "tdc");
  s.grad_norm_pytorch = numbers_or_nan(grad, "pytorch");
  s.max_rel_diff_per_step = numbers_or_nan(f, "max_rel_diff_per_step");
  if (f.has("max_param_rel_diff")) {
    s.max_param_rel_diff = f.number("max_param_rel_diff");
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
  Reader top(j, fmt::format("parity file '{}'", name));
  if (const std::string schema = top.string("schema"); schema != kParitySchema)
    top.fail_at("schema", fmt::format("is not supported (this tdc reads '{}')", kParitySchema), j["schema"]);
  ParityRun run;
  run.source = file;
  run.created = top.string_or("created", "");
  if (const json* m = top.find("machine"); m && m->is_object())
    for (const auto& [k, v] : m->items()) run.machine.emplace_back(k, v.is_string() ? v.get<std::string>() : v.dump());
  const json& scenarios = top.array("scenarios");
  for (size_t i = 0; i < scenarios.size(); ++i)
    run.scenarios.push_back(read_scenario(top.object_at("scenarios", scenarios, i)));
  return run;
}

}  // namespace tdc::cli
