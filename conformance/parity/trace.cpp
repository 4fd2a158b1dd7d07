// Parity traces: JSON form, files, and the verdict (trace.h, [Note: parity verdict]).
#include "tdc/parity/trace.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>

namespace tdc::parity {

namespace {

using json = nlohmann::json;

double number_at(const json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number())
    throw std::runtime_error(fmt::format("trace '{}': field '{}' is missing or not a number", where, key));
  return j[key].get<double>();
}

std::string string_at(const json& j, const std::string& key, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string())
    throw std::runtime_error(fmt::format("trace '{}': field '{}' is missing or not a string", where, key));
  return j[key].get<std::string>();
}

// One quantity against its reference: passes, and its relative difference.
struct Check {
  bool ok;
  double rel;
};
Check check(double got, double want, double scale, const Tolerance& tol) {
  const double diff = std::fabs(got - want);
  const bool ok = std::isfinite(got) && std::isfinite(want) && diff <= tol.atol + tol.rtol * scale;
  return {ok, std::isfinite(diff) ? diff / std::max(scale, 1e-30) : INFINITY};
}

std::string failure(const std::string& what, double got, double want, double scale, const Tolerance& tol) {
  return fmt::format("{}: tdc {:.9g} vs pytorch {:.9g}: |diff| {:.3g} > atol {:.3g} + rtol {:.3g} * {:.3g}", what, got,
                     want, std::fabs(got - want), tol.atol, tol.rtol, scale);
}

}  // namespace

nlohmann::ordered_json to_json(const Trace& t) {
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const auto& s : t.steps) steps.push_back({{"step", s.step}, {"loss", s.loss}, {"grad_norm", s.grad_norm}});
  nlohmann::ordered_json params = nlohmann::ordered_json::object();
  for (const auto& [fqn, c] : t.params) params[fqn] = {{"sum", c.sum}, {"abs_sum", c.abs_sum}, {"norm", c.norm}};
  return {{"schema", kTraceSchema},     {"scenario", t.scenario}, {"side", t.side},  {"version", t.version},
          {"world_size", t.world_size}, {"steps", steps},         {"params", params}};
}

Trace trace_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw std::runtime_error(fmt::format("trace '{}': not a JSON object", where));
  if (string_at(j, "schema", where) != kTraceSchema)
    throw std::runtime_error(
        fmt::format("trace '{}': schema is '{}', expected '{}'", where, j["schema"].get<std::string>(), kTraceSchema));
  Trace t;
  t.scenario = string_at(j, "scenario", where);
  t.side = string_at(j, "side", where);
  t.version = string_at(j, "version", where);
  t.world_size = static_cast<int>(number_at(j, "world_size", where));
  if (!j.contains("steps") || !j["steps"].is_array())
    throw std::runtime_error(fmt::format("trace '{}': field 'steps' is missing or not an array", where));
  for (const auto& s : j["steps"]) {
    t.steps.push_back(
        {static_cast<int>(number_at(s, "step", where)), number_at(s, "loss", where), number_at(s, "grad_norm", where)});
  }
  if (!j.contains("params") || !j["params"].is_object())
    throw std::runtime_error(fmt::format("trace '{}': field 'params' is missing or not an object", where));
  for (const auto& [fqn, c] : j["params"].items()) {
    const std::string w = where + "' params '" + fqn;
    t.params[fqn] = {number_at(c, "sum", w), number_at(c, "abs_sum", w), number_at(c, "norm", w)};
  }
  return t;
}

Trace read_trace(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw std::runtime_error(fmt::format("trace '{}' was not written", file.string()));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw std::runtime_error(fmt::format("trace '{}' is not valid JSON", file.string()));
  return trace_from_json(j, file.string());
}

void write_trace(const std::filesystem::path& file, const Trace& trace) {
  const std::string tmp = fmt::format("{}.tmp.{}", file.string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error(fmt::format("cannot create '{}': {}", tmp, std::strerror(errno)));
    out << to_json(trace).dump(1) << "\n";
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", tmp));
  }
  std::filesystem::rename(tmp, file);
}

Comparison compare_traces(const Trace& tdc, const Trace& pt, const Tolerance& tol) {
  Comparison c;
  std::string first_failure;
  auto record = [&](const Check& k, const std::string& why_not) {
    if (!k.ok && first_failure.empty()) first_failure = why_not;
  };
  if (tdc.steps.size() != pt.steps.size())
    first_failure = fmt::format("tdc traced {} steps, pytorch {}", tdc.steps.size(), pt.steps.size());
  for (size_t i = 0; i < std::min(tdc.steps.size(), pt.steps.size()); ++i) {
    const StepRecord &a = tdc.steps[i], &b = pt.steps[i];
    const Check loss = check(a.loss, b.loss, std::fabs(b.loss), tol);
    const Check norm = check(a.grad_norm, b.grad_norm, std::fabs(b.grad_norm), tol);
    record(loss, failure(fmt::format("step {} loss", i), a.loss, b.loss, std::fabs(b.loss), tol));
    record(norm, failure(fmt::format("step {} grad_norm", i), a.grad_norm, b.grad_norm, std::fabs(b.grad_norm), tol));
    c.max_rel_diff_per_step.push_back(std::max(loss.rel, norm.rel));
  }
  for (const auto& [fqn, b] : pt.params) {
    auto it = tdc.params.find(fqn);
    if (it == tdc.params.end()) {
      if (first_failure.empty()) first_failure = fmt::format("parameter '{}': pytorch has it, tdc does not", fqn);
      continue;
    }
    const Checksums& a = it->second;
    for (auto [what, got, want, scale] : {std::tuple{"sum", a.sum, b.sum, std::fabs(b.abs_sum)},
                                          std::tuple{"abs_sum", a.abs_sum, b.abs_sum, std::fabs(b.abs_sum)},
                                          std::tuple{"norm", a.norm, b.norm, std::fabs(b.norm)}}) {
      const Check k = check(got, want, scale, tol);
      record(k, failure(fmt::format("parameter '{}' {}", fqn, what), got, want, scale, tol));
      c.max_param_rel_diff = std::max(c.max_param_rel_diff, k.rel);
    }
  }
  for (const auto& [fqn, a] : tdc.params) {
    if (!pt.params.count(fqn) && first_failure.empty())
      first_failure = fmt::format("parameter '{}': tdc has it, pytorch does not", fqn);
  }
  if (pt.params.empty() && first_failure.empty()) first_failure = "the pytorch trace has no parameters";
  c.pass = first_failure.empty();
  double max_step = 0;
  for (double d : c.max_rel_diff_per_step) max_step = std::max(max_step, d);
  c.message = c.pass ? fmt::format("max rel diff: steps {:.3g}, parameters {:.3g} (rtol {:.3g}, atol {:.3g})", max_step,
                                   c.max_param_rel_diff, tol.rtol, tol.atol)
                     : first_failure;
  return c;
}

}  // namespace tdc::parity
