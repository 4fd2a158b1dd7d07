// tdc mutate: the mutation score of the conformance suite (docs/reports.md, "Mutation score").
//
// [Note: how a mutant is judged]
// The reference implementation first runs every selected test binary (the baseline); a suite
// that fails on the reference proves nothing, so the run stops. Each mutant is then built as an
// alternative libtdc.so (MutantBuilder) and run with `tdc run --impl`: first PyTorch's seed tests
// (the conformance binaries), then tdc's own suites (unit and interop binaries), each stage in
// the order the catalogue suggests and stopping at the first binary with a failing test. Killed
// by the seed stage counts for both scores ("seed suite alone" and "whole suite"); killed only
// by tdc's suites counts for the whole suite. A failing test of any kind kills: FAIL, TIMEOUT
// (a mutant that deadlocks), CRASH. A mutant that does not build is reported and not scored.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fcntl.h>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../cli.h"
#include "../process.h"
#include "catalogue.h"
#include "mutant_build.h"
#include "tdc/harness/results.h"

namespace tdc::cli {

namespace fs = std::filesystem;
using mutate::Catalogue;
using mutate::Mutant;
using nlohmann::json;

namespace {

const std::vector<OptionSpec> kMutateOptions = {
    {"out", "DIR", "where mutants, logs, mutation.json and mutation.md go (default mutation/)"},
    {"catalogue", "FILE", "the mutants (default SOURCE/conformance/mutants.json)"},
    {"only", "ID,ID", "only these mutants"},
    {"smoke", nullptr, "only the catalogue's smoke mutants, each run on its first listed suite only"},
    {"min-score", "PCT", "exit 1 when the whole suite kills fewer (default 95)"},
    {"timeout", "S", "per-test deadline passed to tdc run (default 120)"},
    {"build-dir", "DIR", "build directory (default $TDC_BUILD)"},
};

constexpr const char* kMutateUsage =
    "usage: tdc mutate [options]\n\n"
    "Builds every mutant of the catalogue (a realistic bug in libtdc) as an alternative\n"
    "implementation and runs the suite against it with `tdc run --impl`: PyTorch's seed tests\n"
    "first, then tdc's own suites. Writes DIR/mutation.json and DIR/mutation.md: killed or\n"
    "survived per mutant, and the score of the seed suite alone against the whole suite.\n"
    "Exit status: 0 when the whole suite kills at least --min-score percent and every mutant\n"
    "built, 1 otherwise, 2 on a usage error or when the suite fails on the reference itself.\n\n"
    "Options:\n";

struct Plan {
  std::vector<std::string> seed, own;  // binary names of the two stages
};

struct StageResult {
  bool ran = false, killed = false;
  int exit = 0;
  std::string killed_by, kill_status, message;
  double seconds = 0;
};

struct Outcome {
  const Mutant* mutant = nullptr;
  std::string status;  // killed-by-seed, killed-by-tdc, survived, build-failed
  StageResult seed, own;
  double build_s = 0;
  std::string build_log;
};

// Binary names from tdc_suites.json: conformance (seed) and unit (tdc's own, without the
// harness's self-tests, which do not use libtdc).
Plan read_plan(const fs::path& build) {
  std::ifstream in(build / "tdc_suites.json");
  json j = json::parse(in);
  Plan p;
  for (const auto& e : j) {
    std::string name = fs::path(e.at("binary").get<std::string>()).filename().string();
    std::string kind = e.at("kind").get<std::string>();
    if (kind == "conformance") p.seed.push_back(name);
    if (kind == "unit" && name.rfind("tdc_harness", 0) != 0) p.own.push_back(name);
  }
  return p;
}

// `binaries` with the mutant's suggested ones first; for the smoke, only the first suggested one.
std::vector<std::string> ordered(const std::vector<std::string>& binaries, const Mutant* m, bool smoke) {
  std::vector<std::string> out;
  if (m)
    for (const auto& s : m->suites)
      if (std::find(binaries.begin(), binaries.end(), s) != binaries.end() && !(smoke && !out.empty()))
        out.push_back(s);
  if (!smoke)
    for (const auto& b : binaries)
      if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
  return out;
}

// One `tdc run` over `binaries` (stopping at the first failing one) against `lib` (none: the
// reference), output to dir/run.log; the first failing test from its results.json.
StageResult run_stage(const fs::path& build, const std::vector<std::string>& binaries,
                      const std::optional<fs::path>& lib, const fs::path& dir, double timeout_s,
                      const std::optional<fs::path>& durations = std::nullopt) {
  StageResult r;
  if (binaries.empty()) return r;
  r.ran = true;
  fs::create_directories(dir);
  // This very executable, even if the file was replaced since it started (then its path reads
  // "... (deleted)"): the spawned child resolves /proc/self/exe to its own image, which is ours.
  const fs::path self = "/proc/self/exe";
  std::string suites;
  for (const auto& b : binaries) suites += (suites.empty() ? "" : ",") + b;
  std::vector<std::string> argv = {self.string(),
                                   "run",
                                   "--build-dir",
                                   build.string(),
                                   "--suites",
                                   suites,
                                   "--stop-on-failure",
                                   "--timeout",
                                   fmt::format("{}", timeout_s),
                                   "--out",
                                   dir.string(),
                                   "--no-report"};
  if (lib) argv.insert(argv.end(), {"--impl", lib->string()});
  // The baseline's durations balance the mutant's shards ([Note: tests side by side]).
  if (durations && fs::is_regular_file(*durations)) argv.insert(argv.end(), {"--durations", durations->string()});
  int fd = ::open((dir / "run.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  auto t0 = std::chrono::steady_clock::now();
  Child child = Child::spawn({argv, fd, fd, {}});
  ::close(fd);
  int status = child.wait();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit = exit_code(status);
  try {
    harness::RunResults res = harness::read_results(dir / "results.json");
    for (const auto& t : res.tests)
      if (harness::is_failure(t.status)) {
        r.killed = true;
        r.killed_by = t.id;
        r.kill_status = harness::to_string(t.status);
        r.message = t.message.substr(0, 400);
        break;
      }
  } catch (const std::exception& e) {
    r.message = fmt::format("no usable results ({}); see {}", e.what(), (dir / "run.log").string());
  }
  if (r.exit == 1 && !r.killed) {  // failed without a failing test record: still a kill, say so
    r.killed = true;
    r.killed_by = "(run)";
    r.kill_status = "FAIL";
  }
  return r;
}

json stage_json(const StageResult& s) {
  if (!s.ran) return nullptr;
  return {{"killed", s.killed},   {"killed_by", s.killed_by}, {"kill_status", s.kill_status},
          {"message", s.message}, {"seconds", s.seconds},     {"exit", s.exit}};
}

struct Score {
  int scored = 0, by_seed = 0, by_whole = 0;
  double pct(int k) const { return scored ? 100.0 * k / scored : 0; }
};

Score score_of(const std::vector<Outcome>& outcomes) {
  Score s;
  for (const auto& o : outcomes) {
    if (o.status == "build-failed") continue;
    ++s.scored;
    s.by_seed += o.status == "killed-by-seed";
    s.by_whole += o.status != "survived";
  }
  return s;
}

void write_reports(const fs::path& out, const std::vector<Outcome>& outcomes, const Score& s, double min_score,
                   const std::string& revision) {
  json mutants = json::array();
  for (const auto& o : outcomes) {
    const Mutant& m = *o.mutant;
    mutants.push_back({{"id", m.id},
                       {"component", m.component},
                       {"file", m.file},
                       {"bug", m.bug},
                       {"status", o.status},
                       {"build_seconds", o.build_s},
                       {"seed", stage_json(o.seed)},
                       {"tdc", stage_json(o.own)},
                       {"survivor_note", m.survivor_note}});
  }
  json j = {{"schema", "tdc-mutation/1"},
            {"created", harness::iso_now()},
            {"suite_revision", revision},
            {"score",
             {{"scored", s.scored},
              {"killed_by_seed", s.by_seed},
              {"killed_by_whole", s.by_whole},
              {"seed_pct", s.pct(s.by_seed)},
              {"whole_pct", s.pct(s.by_whole)},
              {"min_pct", min_score}}},
            {"mutants", mutants}};
  std::ofstream(out / "mutation.json") << j.dump(2) << "\n";

  std::string md = fmt::format(
      "# Mutation score\n\nSuite revision {}; {} mutants scored.\n\n"
      "| suite | killed | score |\n|---|---|---|\n| PyTorch's seed tests alone | {} | {:.1f}% |\n"
      "| tdc's whole suite | {} | {:.1f}% |\n\n"
      "| mutant | component | bug | result | killed by |\n|---|---|---|---|---|\n",
      revision, s.scored, s.by_seed, s.pct(s.by_seed), s.by_whole, s.pct(s.by_whole));
  for (const auto& o : outcomes) {
    const StageResult& k = o.seed.killed ? o.seed : o.own;
    std::string by = k.killed ? fmt::format("`{}` ({})", k.killed_by, k.kill_status) : "";
    if (o.status == "survived") by = o.mutant->survivor_note.empty() ? "**unexplained**" : o.mutant->survivor_note;
    md += fmt::format("| `{}` | {} | {} | {} | {} |\n", o.mutant->id, o.mutant->component, o.mutant->bug, o.status, by);
  }
  std::ofstream(out / "mutation.md") << md;
}

// What `tdc mutate`'s flags ask for, with the mutants chosen from the catalogue.
struct MutateRun {
  fs::path build, root, out, catalogue_path;
  double min_score = 95.0, timeout_s = 120.0;
  bool smoke = false;
  Catalogue catalogue;
  std::vector<const Mutant*> chosen;
};

MutateRun parse_mutate_run(const ParsedArgs& a) {
  MutateRun r;
  r.build = resolve_build_dir(a.get("build-dir"));
  r.root = resolve_source_dir(r.build);
  r.out = fs::absolute(a.get("out").value_or("mutation"));
  r.catalogue_path = a.get("catalogue") ? fs::path(*a.get("catalogue")) : r.root / "conformance/mutants.json";
  if (auto v = a.get("min-score")) r.min_score = std::stod(*v);
  if (auto v = a.get("timeout")) r.timeout_s = parse_seconds("mutate", "timeout", *v);
  r.smoke = a.has("smoke");
  r.catalogue = mutate::read_catalogue(r.catalogue_path, r.root);
  std::vector<std::string> only = r.smoke ? r.catalogue.smoke : std::vector<std::string>{};
  if (auto v = a.get("only")) {
    std::stringstream in(*v);
    for (std::string id; std::getline(in, id, ',');) only.push_back(id);
  }
  const auto& all = r.catalogue.mutants;
  for (const auto& id : only)
    if (std::none_of(all.begin(), all.end(), [&](const Mutant& m) { return m.id == id; }))
      throw UsageError(fmt::format("mutate: no mutant '{}' in {}", id, r.catalogue_path.string()));
  for (const auto& m : all)
    if (only.empty() || std::find(only.begin(), only.end(), m.id) != only.end()) r.chosen.push_back(&m);
  return r;
}

// Baseline: the binaries the mutants will run must pass on the reference (with --smoke, only the
// binaries of the chosen mutants).
void run_baseline(const MutateRun& r, const Plan& plan) {
  std::vector<std::string> base_seed = plan.seed, base_own = plan.own;
  if (r.smoke) {
    base_seed.clear(), base_own.clear();
    auto add = [](std::vector<std::string>& into, const std::vector<std::string>& bins) {
      for (const auto& b : bins)
        if (std::find(into.begin(), into.end(), b) == into.end()) into.push_back(b);
    };
    for (const Mutant* m : r.chosen) {
      add(base_seed, ordered(plan.seed, m, true));
      add(base_own, ordered(plan.own, m, true));
    }
  }
  fmt::print(stderr, "tdc mutate: {} mutants; baseline: {} seed + {} tdc binaries on the reference\n", r.chosen.size(),
             base_seed.size(), base_own.size());
  for (auto [name, bins] : {std::pair{"seed", base_seed}, std::pair{"tdc", base_own}}) {
    StageResult b = run_stage(r.build, bins, std::nullopt, r.out / "baseline" / name, r.timeout_s);
    if (b.ran && (b.killed || b.exit != 0))
      throw UsageError(
          fmt::format("mutate: the suite fails on the reference implementation ({} {}: {}); fix that "
                      "first (log: {})",
                      b.killed_by, b.kill_status, b.message, (r.out / "baseline" / name / "run.log").string()));
  }
}

// One mutant: built, then PyTorch's seed tests, then (if they did not kill it) tdc's own.
Outcome run_mutant(const MutateRun& r, const Plan& plan, const mutate::MutantBuilder& builder, const Mutant& m) {
  Outcome o{&m};
  const fs::path dir = r.out / "mutants" / m.id;
  auto built = builder.build(m, dir);
  o.build_s = built.seconds;
  if (!built.ok) {
    o.status = "build-failed";
    o.build_log = built.log;
    std::ofstream(dir / "build.log") << built.log;
    return o;
  }
  o.seed = run_stage(r.build, ordered(plan.seed, &m, r.smoke), built.library, dir / "seed", r.timeout_s,
                     r.out / "baseline" / "seed" / "results.json");
  if (!o.seed.killed)
    o.own = run_stage(r.build, ordered(plan.own, &m, r.smoke), built.library, dir / "tdc", r.timeout_s,
                      r.out / "baseline" / "tdc" / "results.json");
  o.status = o.seed.killed ? "killed-by-seed" : o.own.killed ? "killed-by-tdc" : "survived";
  return o;
}

// The score, every mutant that was not killed, and the exit status.
int finish_mutate(const MutateRun& r, const std::vector<Outcome>& outcomes) {
  Score s = score_of(outcomes);
  bool all_built =
      std::none_of(outcomes.begin(), outcomes.end(), [](const Outcome& o) { return o.status == "build-failed"; });
  fmt::print("\nmutation score: PyTorch's seed tests alone {}/{} ({:.1f}%), tdc's whole suite {}/{} ({:.1f}%)\n",
             s.by_seed, s.scored, s.pct(s.by_seed), s.by_whole, s.scored, s.pct(s.by_whole));
  for (const auto& o : outcomes)
    if (o.status != "killed-by-seed" && o.status != "killed-by-tdc")
      fmt::print("  {}: {} {}\n", o.status, o.mutant->id,
                 o.status == "build-failed" ? "(see " + (r.out / "mutants" / o.mutant->id / "build.log").string() + ")"
                                            : o.mutant->survivor_note);
  fmt::print("report: {}\n", (r.out / "mutation.md").string());
  if (interrupted()) return kExitInterrupted;
  return all_built && s.pct(s.by_whole) >= r.min_score ? kExitOk : kExitFailed;
}

}  // namespace

int mutate_command(const std::vector<std::string>& args) {
  ParsedArgs a = parse_args("mutate", kMutateOptions, args, false);
  if (a.help) {
    fmt::print("{}{}", kMutateUsage, format_options(kMutateOptions));
    return kExitOk;
  }
  const MutateRun r = parse_mutate_run(a);
  mutate::MutantBuilder builder(r.build, r.root);
  Plan plan = read_plan(r.build);
  fs::create_directories(r.out);
  std::string revision = std::getenv("TDC_SUITE_REVISION") ? std::getenv("TDC_SUITE_REVISION") : "";
  run_baseline(r, plan);
  std::vector<Outcome> outcomes;
  for (size_t i = 0; i < r.chosen.size() && !interrupted(); ++i) {
    Outcome o = run_mutant(r, plan, builder, *r.chosen[i]);
    const StageResult& k = o.seed.killed ? o.seed : o.own;
    fmt::print(stderr, "[{}/{}] {:<40} build {:>5.0f} s  {:<15} {} ({:.0f} s)\n", i + 1, r.chosen.size(), o.mutant->id,
               o.build_s, o.status, k.killed ? k.killed_by + " " + k.kill_status : "", o.seed.seconds + o.own.seconds);
    outcomes.push_back(std::move(o));
    write_reports(r.out, outcomes, score_of(outcomes), r.min_score,
                  revision);  // partial results survive an interruption
  }
  return finish_mutate(r, outcomes);
}

}  // namespace tdc::cli
