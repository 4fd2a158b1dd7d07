// Parity traces: JSON form, files, and the verdict (trace.h, [Note: parity verdict]).
#include "tdc/parity/trace.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include <tdc/json/reader.h>

namespace tdc::parity {

namespace {

using json = nlohmann::json;

using TraceReader = tdc::json::Reader<std::runtime_error>;  // [Note: one JSON reader]

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
  TraceReader r(j, fmt::format("trace '{}'", where));
  const std::string schema = r.string("schema");
  if (schema != kTraceSchema) r.fail_at("schema", fmt::format("must be '{}'", kTraceSchema), j["schema"]);
  Trace t;
  t.scenario = r.string("scenario");
  t.side = r.string("side");
  t.version = r.string("version");
  t.world_size = static_cast<int>(r.integer("world_size", 1, std::numeric_limits<int>::max()));
  const json& steps = r.array("steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    TraceReader s = r.object_at("steps", steps, i);
    t.steps.push_back({static_cast<int>(s.integer("step", 0, std::numeric_limits<int>::max())), s.number("loss"),
                       s.number("grad_norm")});
  }
  TraceReader params = r.object("params");
  for (const auto& [fqn, c] : r.need("params").items()) {
    TraceReader p = params.object(fqn);
    t.params[fqn] = {p.number("sum"), p.number("abs_sum"), p.number("norm")};
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
