// The parity verdict and the scenario checks (tdc/parity/trace.h, scenario.h), without running
// anything: a trace compared with itself passes; a perturbation of any one quantity beyond the
// tolerance fails and the message names it; structural mismatches fail; every shipped scenario
// loads; malformed scenario files are refused with the file, the field and the value.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tdc/parity/scenario.h"
#include "tdc/parity/trace.h"

namespace {

using namespace tdc::parity;
namespace fs = std::filesystem;

Trace sample_trace() {
  Trace t{.scenario = "s", .side = "pytorch", .version = "2.13.0", .world_size = 2};
  t.steps = {{0, 0.892, 0.159}, {1, 0.910, 0.096}, {2, 0.804, 0.124}};
  t.params["0.in_proj.weight"] = {0.8976, 97.37, 3.996};
  t.params["0.in_proj.bias"] = {-0.3419, 5.880, 0.9897};
  return t;
}

const Tolerance kTol{.rtol = 1e-6, .atol = 0, .why = "test"};

TEST(ParityVerdict, IdenticalTracesPass) {
  const Comparison c = compare_traces(sample_trace(), sample_trace(), kTol);
  EXPECT_TRUE(c.pass) << c.message;
  ASSERT_EQ(c.max_rel_diff_per_step.size(), 3u);
  for (double d : c.max_rel_diff_per_step) EXPECT_EQ(d, 0.0);
  EXPECT_EQ(c.max_param_rel_diff, 0.0);
}

TEST(ParityVerdict, DifferencesWithinToleranceArePassedAndReported) {
  Trace tdc = sample_trace();
  tdc.steps[1].loss *= 1 + 5e-7;
  tdc.params["0.in_proj.weight"].norm *= 1 - 5e-7;
  const Comparison c = compare_traces(tdc, sample_trace(), kTol);
  EXPECT_TRUE(c.pass) << c.message;
  EXPECT_NEAR(c.max_rel_diff_per_step[1], 5e-7, 1e-9);
  EXPECT_EQ(c.max_rel_diff_per_step[0], 0.0);
  EXPECT_NEAR(c.max_param_rel_diff, 5e-7, 1e-9);
}

// Each quantity, perturbed by 1e-5 relative (10x the tolerance), fails the verdict on its own.
TEST(ParityVerdict, EachPerturbedQuantityFails) {
  const std::vector<std::pair<std::string, std::function<void(Trace&)>>> cases = {
      {"step 2 loss", [](Trace& t) { t.steps[2].loss *= 1 + 1e-5; }},
      {"step 0 grad_norm", [](Trace& t) { t.steps[0].grad_norm *= 1 - 1e-5; }},
      {"parameter '0.in_proj.bias' sum", [](Trace& t) { t.params["0.in_proj.bias"].sum += 1e-5 * 5.880; }},
      {"parameter '0.in_proj.weight' abs_sum", [](Trace& t) { t.params["0.in_proj.weight"].abs_sum *= 1 + 1e-5; }},
      {"parameter '0.in_proj.weight' norm", [](Trace& t) { t.params["0.in_proj.weight"].norm *= 1 + 1e-5; }},
      {"step 1 loss", [](Trace& t) { t.steps[1].loss = NAN; }},
  };
  for (const auto& [what, perturb] : cases) {
    Trace tdc = sample_trace();
    perturb(tdc);
    const Comparison c = compare_traces(tdc, sample_trace(), kTol);
    EXPECT_FALSE(c.pass) << what;
    EXPECT_NE(c.message.find(what), std::string::npos) << "message '" << c.message << "' does not name " << what;
  }
}

// A parameter's sum is judged against its abs_sum: a sum that cancels to ~0 still passes a
// difference that is tiny relative to the values.
TEST(ParityVerdict, SumIsJudgedRelativeToAbsSum) {
  Trace ref = sample_trace();
  ref.params["0.in_proj.bias"].sum = 1e-12;
  Trace tdc = ref;
  tdc.params["0.in_proj.bias"].sum = 1e-12 + 1e-8;  // 1e-8 / abs_sum 5.88 = 1.7e-9 relative
  EXPECT_TRUE(compare_traces(tdc, ref, kTol).pass);
  tdc.params["0.in_proj.bias"].sum = 1e-12 + 1e-4;
  EXPECT_FALSE(compare_traces(tdc, ref, kTol).pass);
}

TEST(ParityVerdict, StructuralMismatchesFail) {
  Trace fewer = sample_trace();
  fewer.steps.pop_back();
  Comparison c = compare_traces(fewer, sample_trace(), kTol);
  EXPECT_FALSE(c.pass);
  EXPECT_NE(c.message.find("tdc traced 2 steps, pytorch 3"), std::string::npos) << c.message;

  Trace missing = sample_trace();
  missing.params.erase("0.in_proj.bias");
  c = compare_traces(missing, sample_trace(), kTol);
  EXPECT_FALSE(c.pass);
  EXPECT_NE(c.message.find("'0.in_proj.bias': pytorch has it, tdc does not"), std::string::npos) << c.message;

  Trace extra = sample_trace();
  extra.params["module.0.in_proj.bias"] = {0, 0, 0};
  c = compare_traces(extra, sample_trace(), kTol);
  EXPECT_FALSE(c.pass);
  EXPECT_NE(c.message.find("'module.0.in_proj.bias': tdc has it"), std::string::npos) << c.message;
}

TEST(ParityTrace, JsonRoundTripIsExact) {
  Trace t = sample_trace();
  t.steps[0].loss = 0.1 + 0.2;  // not representable in few digits
  const Trace back = trace_from_json(nlohmann::json::parse(to_json(t).dump()), "test");
  EXPECT_EQ(back.steps[0].loss, t.steps[0].loss);
  EXPECT_TRUE(compare_traces(back, t, {.rtol = 0, .atol = 0, .why = ""}).pass);
  nlohmann::json bad = to_json(t);
  bad["schema"] = "tdc-parity-trace/0";
  EXPECT_THROW(trace_from_json(bad, "x.json"), std::runtime_error);
}

// ------------------------------------------------------------------ scenario files

TEST(ParityScenario, EveryShippedScenarioLoads) {
  int n = 0;
  std::set<int> world_sizes;
  for (const auto& e : fs::directory_iterator(TDC_SCENARIO_DIR)) {
    if (e.path().extension() != ".json") continue;
    const Scenario s = load_scenario(e.path());
    EXPECT_EQ(s.name, e.path().stem().string()) << "a scenario's name is its file name";
    EXPECT_GE(s.steps, 3) << s.name;
    EXPECT_LE(s.steps, 5) << s.name;
    EXPECT_FALSE(s.tolerance.why.empty()) << s.name;
    EXPECT_EQ(s.perturb_tdc_lr_scale, 1.0) << s.name << ": a shipped scenario must not perturb tdc's side";
    world_sizes.insert(s.world_size);
    ++n;
  }
  EXPECT_GE(n, 10);
  EXPECT_EQ(world_sizes, (std::set<int>{1, 2, 3, 4}));
}

class ScenarioFile {
 public:
  explicit ScenarioFile(const nlohmann::json& j) : path_(fs::temp_directory_path() / "tdc_parity_bad_scenario.json") {
    std::ofstream(path_) << j.dump();
  }
  ~ScenarioFile() { fs::remove(path_); }
  std::string error() const {
    try {
      load_scenario(path_);
    } catch (const ScenarioError& e) {
      return e.what();
    }
    return "(no error)";
  }
  const fs::path path_;
};

nlohmann::json valid() {
  return nlohmann::json::parse(R"({
    "name": "x", "description": "d", "model": {"type": "mlp_stack", "dim": 16}, "init_seed": 1,
    "data_seed": 2, "world_size": 2, "mesh": {"shape": [2], "dim_names": ["dp"]},
    "recipe": {"kind": "fsdp"}, "batch": 8, "optimizer": {"type": "adam", "lr": 0.001}, "steps": 3,
    "tolerance": {"rtol": 1e-5, "atol": 1e-9, "why": "w"}})");
}

TEST(ParityScenario, MalformedFilesNameFileFieldAndValue) {
  EXPECT_EQ(ScenarioFile(valid()).error(), "(no error)");
  const std::string file = "scenario '" + (fs::temp_directory_path() / "tdc_parity_bad_scenario.json").string() + "'";
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j.erase("steps"); }, file + ": missing field 'steps'"},
      {[](auto& j) { j["recipe"]["kind"] = "zero3"; },
       file + ": field 'recipe.kind': unknown value (known: none, ddp, "
              "tp, fsdp, hsdp, tp_fsdp, pipeline, fsdp1) (value: \"zero3\")"},
      {[](auto& j) { j["world_size"] = 5; }, file + ": field 'world_size': must be an integer in 1..4 (value: 5)"},
      {[](auto& j) { j["world_size"] = 0; }, file + ": field 'world_size': must be an integer in 1..4 (value: 0)"},
      {[](auto& j) { j["mesh"]["shape"] = {4}; },
       file + ": field 'mesh.shape': has 4 ranks; world_size is 2 (value: [4])"},
      {[](auto& j) { j["mesh"]["dim_names"] = {"tp"}; },
       file + ": field 'mesh.dim_names': recipe 'fsdp' needs [\"dp\"] (value: [\"tp\"])"},
      {[](auto& j) { j["batch"] = 7; },
       file + ": field 'batch': must split evenly over the 2 data-parallel ranks (value: 7)"},
      {[](auto& j) { j["optimizer"]["lr"] = "fast"; },
       file + ": field 'optimizer.lr': must be a number (value: \"fast\")"},
      {[](auto& j) { j["stepz"] = 3; }, file + ": field 'stepz': unknown field (value: 3)"},
      {[](auto& j) { j["tolerance"].erase("why"); }, file + ": missing field 'tolerance.why'"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = valid();
    c.edit(j);
    EXPECT_EQ(ScenarioFile(j).error(), c.want);
  }
}

// FSDP1 scenarios: the FSDP1 test models go with recipe fsdp1 only, and take no seeds or batch.
nlohmann::json valid_fsdp1() {
  return nlohmann::json::parse(R"({
    "name": "x", "description": "d", "model": {"type": "nested_wrapped_module"}, "world_size": 2,
    "mesh": {"shape": [2], "dim_names": ["dp"]},
    "recipe": {"kind": "fsdp1", "sharding_strategy": "SHARD_GRAD_OP", "use_orig_params": true},
    "optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}, "steps": 3,
    "tolerance": {"rtol": 0, "atol": 0, "why": "w"}})");
}

TEST(ParityScenario, Fsdp1ScenariosAreChecked) {
  {
    const ScenarioFile f(valid_fsdp1());
    ASSERT_EQ(f.error(), "(no error)");
    const Scenario s = load_scenario(f.path_);
    EXPECT_EQ(s.recipe.sharding_strategy, "SHARD_GRAD_OP");
    EXPECT_TRUE(s.recipe.use_orig_params);
    EXPECT_TRUE(s.model.is_fsdp1_fixture());
    EXPECT_EQ(s.dp_size(), 2);
    EXPECT_EQ(describe_recipe(s), "fsdp1 (dp 2) SHARD_GRAD_OP orig");
  }
  const std::string file = "scenario '" + (fs::temp_directory_path() / "tdc_parity_bad_scenario.json").string() + "'";
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j["init_seed"] = 1; },
       file + ": field 'init_seed': not with model 'nested_wrapped_module': the fixture seeds its own weights and "
              "draws its own inputs (value: 1)"},
      {[](auto& j) { j["batch"] = 8; },
       file + ": field 'batch': not with model 'nested_wrapped_module': the fixture seeds its own weights and draws "
              "its own inputs (value: 8)"},
      {[](auto& j) { j["model"]["dim"] = 8; }, file + ": field 'model.dim': unknown field (value: 8)"},
      {[](auto& j) { j["recipe"]["sharding_strategy"] = "ZERO3"; },
       file + ": field 'recipe.sharding_strategy': unknown value (known: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD) "
              "(value: \"ZERO3\")"},
      {[](auto& j) { j["recipe"].erase("sharding_strategy"); }, file + ": missing field 'recipe.sharding_strategy'"},
      {[](auto& j) {
         j["recipe"] = {{"kind", "fsdp"}};
       },
       file + ": field 'recipe.kind': model 'nested_wrapped_module' (an FSDP1 test model) needs recipe 'fsdp1' "
              "(or 'none': unwrapped, 1 rank) (value: \"fsdp\")"},
      {[](auto& j) { j["recipe"]["grad_accum"] = 2; },
       file + ": field 'recipe.grad_accum': not with recipe 'fsdp1' (value: 2)"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = valid_fsdp1();
    c.edit(j);
    EXPECT_EQ(ScenarioFile(j).error(), c.want);
  }
  // recipe fsdp1 on a model that is not an FSDP1 test model
  nlohmann::json j = valid();
  j["recipe"] = {{"kind", "fsdp1"}, {"sharding_strategy", "FULL_SHARD"}};
  EXPECT_EQ(ScenarioFile(j).error(),
            file +
                ": field 'model.type': recipe 'fsdp1' needs an FSDP1 test model (nested_wrapped_module, "
                "transformer_with_shared_params) (value: \"mlp_stack\")");
}

// [Note: scenario requires a release]: a scenario names the first PyTorch release that can run it;
// older releases get the why, the same and newer ones run it; a malformed requirement is refused.
TEST(ParityScenario, RequiresReleaseIsCheckedAndCompared) {
  nlohmann::json j = valid();
  j["requires"] = {{"pytorch", "2.12"}, {"why", "2.11's mse_loss backward"}};
  const ScenarioFile f(j);
  ASSERT_EQ(f.error(), "(no error)");
  const Scenario s = load_scenario(f.path_);
  ASSERT_TRUE(s.requires_release.has_value());
  EXPECT_EQ(unmet_requirement(s, "2.11.0+cu130"),
            std::optional<std::string>("needs PyTorch >= 2.12 (this is 2.11.0+cu130): 2.11's mse_loss backward"));
  EXPECT_TRUE(unmet_requirement(s, "1.13.1").has_value());
  EXPECT_EQ(unmet_requirement(s, "2.12.0"), std::nullopt);
  EXPECT_EQ(unmet_requirement(s, "2.12.1+cu130"), std::nullopt);
  EXPECT_EQ(unmet_requirement(s, "2.13.0"), std::nullopt);
  EXPECT_EQ(unmet_requirement(s, "3.0"), std::nullopt);
  EXPECT_THROW(unmet_requirement(s, "unknown"), ScenarioError);
  EXPECT_EQ(unmet_requirement(load_scenario(ScenarioFile(valid()).path_), "unknown"), std::nullopt)
      << "a scenario without requirements runs anywhere";
  {
    nlohmann::json k = valid();
    k["requires"] = {{"pytorch", "2.12.1"}, {"why", "w"}};
    const Scenario p = load_scenario(ScenarioFile(k).path_);
    EXPECT_TRUE(unmet_requirement(p, "2.12.0").has_value());
    EXPECT_EQ(unmet_requirement(p, "2.12.1"), std::nullopt);
  }
  const std::string file = "scenario '" + (fs::temp_directory_path() / "tdc_parity_bad_scenario.json").string() + "'";
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {{{"pytorch", "two"}, {"why", "w"}},
       file + ": field 'requires.pytorch': must be a release MAJOR.MINOR[.PATCH] (value: \"two\")"},
      {{{"pytorch", "2"}, {"why", "w"}},
       file + ": field 'requires.pytorch': must be a release MAJOR.MINOR[.PATCH] (value: \"2\")"},
      {{{"pytorch", "2.12"}}, file + ": missing field 'requires.why'"},
      {{{"pytorch", "2.12"}, {"why", ""}}, file + ": field 'requires.why': must not be empty (value: \"\")"},
      {{{"pytorch", "2.12"}, {"why", "w"}, {"max", "3"}},
       file + ": field 'requires.max': unknown field (value: \"3\")"},
  };
  for (const auto& [req, want] : bad) {
    nlohmann::json k = valid();
    k["requires"] = req;
    EXPECT_EQ(ScenarioFile(k).error(), want) << req.dump();
  }
}

}  // namespace
