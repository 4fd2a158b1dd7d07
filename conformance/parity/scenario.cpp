// load_scenario: reading and checking a parity scenario file (scenario.h).
#include "tdc/parity/scenario.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <tdc/json/reader.h>

namespace tdc::parity {

namespace {

using json = nlohmann::json;

const std::vector<std::string> kRecipes = {"none", "ddp", "tp", "fsdp", "hsdp", "tp_fsdp", "pipeline", "fsdp1"};
const std::vector<std::string> kModels = {"mlp_stack", "mlp_layers", "transformer", "nested_wrapped_module",
                                          "transformer_with_shared_params"};
const std::vector<std::string> kShardingStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"};
const std::vector<std::string> kOptimizers = {"sgd", "adam"};
const std::vector<std::string> kDtypes = {"float32", "bfloat16", "float16"};
const std::vector<std::string> kSchedules = {"GPipe", "1F1B"};
constexpr int kMaxWorld = 4, kMaxSteps = 20;

// [Note: one JSON reader]: errors read "scenario 'FILE': field 'PATH': ... (value: ...)".
using ScenarioReader = tdc::json::Reader<ScenarioError>;

ModelSpec read_model(ScenarioReader r) {
  ModelSpec m;
  m.type = r.string("type", kModels);
  if (m.is_fsdp1_fixture()) {  // the fixture fixes its own sizes
    r.no_unknown_keys();
    return m;
  }
  m.dim = r.integer("dim", 1, 4096);
  if (m.type == "mlp_layers") m.layers = r.integer("layers", 1, 64);
  if (m.type == "transformer") {
    m.vocab_size = r.integer("vocab_size", 2, 1 << 20);
    m.n_layers = r.integer("n_layers", 1, 64);
    m.n_heads = r.integer("n_heads", 1, 64);
    m.seq_len = r.integer("seq_len", 1, 4096);
    if (m.dim % m.n_heads != 0)
      r.fail_at(r.field("n_heads"), fmt::format("must divide dim {}", m.dim), json(m.n_heads));
  }
  r.no_unknown_keys();
  return m;
}

Recipe read_recipe(ScenarioReader r) {
  Recipe rc;
  rc.kind = r.string("kind", kRecipes);
  if (rc.kind == "fsdp1") {
    rc.sharding_strategy = r.string("sharding_strategy", kShardingStrategies);
    rc.use_orig_params = r.boolean_or("use_orig_params", false);
  }
  if (r.find("mixed_precision")) {
    ScenarioReader mp = r.object("mixed_precision");
    rc.mixed_precision =
        MixedPrecision{mp.string("param_dtype", kDtypes), mp.string_or("reduce_dtype", "float32", kDtypes)};
    mp.no_unknown_keys();
  }
  rc.grad_accum = static_cast<int>(r.integer_or("grad_accum", 1, 1, 16));
  rc.activation_checkpointing = r.boolean_or("activation_checkpointing", false);
  if (rc.kind == "pipeline") {
    rc.schedule = r.string("schedule", kSchedules);
    rc.microbatches = static_cast<int>(r.integer("microbatches", 1, 64));
  }
  if (r.find("checkpoint_resume_at"))
    rc.checkpoint_resume_at = static_cast<int>(r.integer("checkpoint_resume_at", 1, kMaxSteps - 1));
  r.no_unknown_keys();
  return rc;
}

// The mesh dim names each recipe expects (alternatives).
std::vector<std::vector<std::string>> mesh_names_for(const std::string& kind) {
  if (kind == "none" || kind == "ddp" || kind == "fsdp" || kind == "fsdp1") return {{"dp"}};
  if (kind == "tp") return {{"tp"}};
  if (kind == "hsdp") return {{"replicate", "shard"}};
  if (kind == "tp_fsdp") return {{"dp", "tp"}};
  return {{"pp"}, {"dp", "pp"}};  // pipeline
}

int64_t mesh_size_of(const Scenario& s, const std::string& name) {
  for (size_t i = 0; i < s.mesh_dim_names.size(); ++i)
    if (s.mesh_dim_names[i] == name) return s.mesh_shape[i];
  return 1;
}

// How the fields fit together.
void check_consistency(const Scenario& s, ScenarioReader& r) {
  const Recipe& rc = s.recipe;
  auto fail = [&](const std::string& field, const std::string& what, const json& value) {
    r.fail_at(field, what, value);
  };
  const auto expected = mesh_names_for(rc.kind);
  if (std::find(expected.begin(), expected.end(), s.mesh_dim_names) == expected.end()) {
    std::vector<std::string> alts;
    for (const auto& e : expected) alts.push_back(json(e).dump());
    fail("mesh.dim_names", fmt::format("recipe '{}' needs {}", rc.kind, fmt::join(alts, " or ")),
         json(s.mesh_dim_names));
  }
  int64_t product = 1;
  for (int64_t d : s.mesh_shape) product *= d;
  if (product != s.world_size)
    fail("mesh.shape", fmt::format("has {} ranks; world_size is {}", product, s.world_size), json(s.mesh_shape));
  if (rc.kind == "none" && s.world_size != 1) fail("world_size", "recipe 'none' runs on 1 rank", json(s.world_size));
  if (rc.kind == "fsdp1" && !s.model.is_fsdp1_fixture())
    fail("model.type",
         "recipe 'fsdp1' needs an FSDP1 test model (nested_wrapped_module, transformer_with_shared_params)",
         json(s.model.type));
  if (s.model.is_fsdp1_fixture() && rc.kind != "fsdp1" && rc.kind != "none")
    fail("recipe.kind",
         fmt::format("model '{}' (an FSDP1 test model) needs recipe 'fsdp1' (or 'none': unwrapped, 1 rank)",
                     s.model.type),
         json(rc.kind));
  if (rc.kind == "fsdp1") {
    if (rc.mixed_precision)
      fail("recipe.mixed_precision", "not with recipe 'fsdp1'", json(rc.mixed_precision->param_dtype));
    if (rc.grad_accum != 1) fail("recipe.grad_accum", "not with recipe 'fsdp1'", json(rc.grad_accum));
    if (rc.activation_checkpointing) fail("recipe.activation_checkpointing", "not with recipe 'fsdp1'", json(true));
    if (rc.checkpoint_resume_at)
      fail("recipe.checkpoint_resume_at", "not with recipe 'fsdp1'", json(*rc.checkpoint_resume_at));
  }
  if ((rc.kind == "tp" || rc.kind == "tp_fsdp") && s.model.type != "mlp_stack")
    fail("model.type", fmt::format("recipe '{}' needs model 'mlp_stack'", rc.kind), json(s.model.type));
  const bool fsdp_kind = rc.kind == "fsdp" || rc.kind == "hsdp" || rc.kind == "tp_fsdp" ||
                         (rc.kind == "pipeline" && mesh_size_of(s, "dp") > 1);
  if (rc.mixed_precision && !fsdp_kind)
    fail("recipe.mixed_precision", fmt::format("only FSDP recipes take a mixed precision policy, not '{}'", rc.kind),
         json(rc.mixed_precision->param_dtype));
  const int64_t dp = s.dp_size();
  if (!s.model.is_fsdp1_fixture() && s.batch % dp != 0)
    fail("batch", fmt::format("must split evenly over the {} data-parallel ranks", dp), json(s.batch));
  if (rc.kind == "pipeline") {
    const int64_t pp = mesh_size_of(s, "pp");
    if (s.model.type != "mlp_layers")
      fail("model.type", "recipe 'pipeline' needs model 'mlp_layers'", json(s.model.type));
    else if (s.model.layers % pp != 0)
      fail("model.layers", fmt::format("must split evenly into {} stages", pp), json(s.model.layers));
    if ((s.batch / dp) % rc.microbatches != 0)
      fail("recipe.microbatches", fmt::format("must divide the per-rank batch {}", s.batch / dp),
           json(rc.microbatches));
    if (rc.schedule == "1F1B" && rc.microbatches < pp)
      fail("recipe.microbatches", fmt::format("1F1B needs at least {} (the number of stages)", pp),
           json(rc.microbatches));
    if (rc.grad_accum != 1)
      fail("recipe.grad_accum", "not with recipe 'pipeline' (use microbatches)", json(rc.grad_accum));
    if (rc.checkpoint_resume_at)
      fail("recipe.checkpoint_resume_at", "not with recipe 'pipeline'", json(*rc.checkpoint_resume_at));
    if (rc.activation_checkpointing) fail("recipe.activation_checkpointing", "not with recipe 'pipeline'", json(true));
  }
  if (rc.checkpoint_resume_at && *rc.checkpoint_resume_at >= s.steps)
    fail("recipe.checkpoint_resume_at", fmt::format("must be below steps ({})", s.steps),
         json(*rc.checkpoint_resume_at));
}

// "2.12" -> {2, 12}; "2.12.1+cu130" -> {2, 12, 1}; {} unless it starts with MAJOR.MINOR.
std::vector<int> parse_release(const std::string& v) {
  std::vector<int> out;
  size_t i = 0;
  while (out.size() < 3 && i < v.size() && std::isdigit(static_cast<unsigned char>(v[i]))) {
    int n = 0;
    size_t digits = 0;
    for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])) && digits < 6; ++i, ++digits)
      n = n * 10 + (v[i] - '0');
    out.push_back(n);
    if (i < v.size() && v[i] == '.')
      ++i;
    else
      break;
  }
  if (out.size() < 2) return {};
  return out;
}

}  // namespace

std::optional<std::string> unmet_requirement(const Scenario& s, const std::string& version) {
  if (!s.requires_release) return std::nullopt;
  std::vector<int> have = parse_release(version);
  if (have.empty())
    throw ScenarioError(fmt::format("scenario '{}': cannot tell whether PyTorch '{}' meets requires.pytorch",
                                    s.file.string(), version));
  const std::vector<int>& need = s.requires_release->min_pytorch;
  have.resize(std::max(have.size(), need.size()), 0);
  if (!std::lexicographical_compare(have.begin(), have.end(), need.begin(), need.end())) return std::nullopt;
  return fmt::format("needs PyTorch >= {} (this is {}): {}", fmt::join(need, "."), version, s.requires_release->why);
}

bool ModelSpec::is_fsdp1_fixture() const {
  return type == "nested_wrapped_module" || type == "transformer_with_shared_params";
}

int64_t Scenario::dp_size() const {
  const std::string& k = recipe.kind;
  if (k == "ddp" || k == "fsdp" || k == "hsdp" || k == "fsdp1") return world_size;
  if (k == "tp_fsdp" || k == "pipeline") return mesh_size_of(*this, "dp");
  return 1;
}

Scenario load_scenario(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw ScenarioError(fmt::format("scenario '{}': cannot be read", file.string()));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ScenarioError(fmt::format("scenario '{}': not valid JSON", file.string()));
  ScenarioReader r(j, fmt::format("scenario '{}'", file.string()));
  Scenario s;
  s.file = file;
  s.name = r.string("name");
  if (s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
    r.fail_at("name", "may hold only a-z, 0-9, '_' and '-' (it names files)", json(s.name));
  s.description = r.string("description");
  s.model = read_model(r.object("model"));
  // The FSDP1 test models seed their weights (deterministic=True) and inputs (get_input) themselves.
  const bool fixture = s.model.is_fsdp1_fixture();
  for (const char* key : {"init_seed", "data_seed", "batch"}) {
    if (fixture && r.find(key))
      r.fail_at(
          key,
          fmt::format("not with model '{}': the fixture seeds its own weights and draws its own inputs", s.model.type),
          *r.find(key));
  }
  if (!fixture) {
    s.init_seed = r.integer("init_seed", 0, INT64_MAX);
    s.data_seed = r.integer("data_seed", 0, INT64_MAX);
  }
  s.world_size = static_cast<int>(r.integer("world_size", 1, kMaxWorld));
  {
    ScenarioReader mesh = r.object("mesh");
    s.mesh_shape = mesh.integers("shape", 1, kMaxWorld);
    if (s.mesh_shape.empty() || s.mesh_shape.size() > 2)
      mesh.fail_at("mesh.shape", "must be a list of 1 or 2 sizes", mesh.need("shape"));
    s.mesh_dim_names = mesh.strings("dim_names");
    if (s.mesh_dim_names.size() != s.mesh_shape.size())
      mesh.fail_at("mesh.dim_names", "must have one name per mesh dim", mesh.need("dim_names"));
    mesh.no_unknown_keys();
  }
  s.recipe = read_recipe(r.object("recipe"));
  if (!fixture) s.batch = r.integer("batch", 1, 1 << 16);
  {
    ScenarioReader o = r.object("optimizer");
    s.optimizer.type = o.string("type", kOptimizers);
    s.optimizer.lr = o.number("lr", 0);
    if (s.optimizer.type == "sgd") s.optimizer.momentum = o.number_or("momentum", 0, 0);
    o.no_unknown_keys();
  }
  s.steps = static_cast<int>(r.integer("steps", 1, kMaxSteps));
  {
    ScenarioReader t = r.object("tolerance");
    s.tolerance.rtol = t.number("rtol", 0);
    s.tolerance.atol = t.number("atol", 0);
    s.tolerance.why = t.string("why");
    t.no_unknown_keys();
  }
  if (r.find("requires")) {
    ScenarioReader q = r.object("requires");
    const std::string v = q.string("pytorch");
    Requirement req;
    req.min_pytorch = parse_release(v);
    if (req.min_pytorch.empty()) q.fail_at("requires.pytorch", "must be a release MAJOR.MINOR[.PATCH]", json(v));
    req.why = q.string("why");
    q.no_unknown_keys();
    s.requires_release = std::move(req);
  }
  if (r.find("perturb_tdc")) {
    ScenarioReader p = r.object("perturb_tdc");
    s.perturb_tdc_lr_scale = p.number("lr_scale", 0);
    p.no_unknown_keys();
  }
  r.no_unknown_keys();
  check_consistency(s, r);
  return s;
}

std::string describe_recipe(const Scenario& s) {
  const Recipe& rc = s.recipe;
  std::string mesh;
  for (size_t i = 0; i < s.mesh_shape.size(); ++i)
    mesh += fmt::format("{}{} {}", i ? " x " : "", s.mesh_dim_names[i], s.mesh_shape[i]);
  std::string out = rc.kind == "none" ? "single process" : fmt::format("{} ({})", rc.kind, mesh);
  if (rc.kind == "pipeline") out += fmt::format(" {} x{} mb", rc.schedule, rc.microbatches);
  if (rc.kind == "fsdp1") out += fmt::format(" {}{}", rc.sharding_strategy, rc.use_orig_params ? " orig" : "");
  if (rc.mixed_precision)
    out += fmt::format(" + {}/{}", rc.mixed_precision->param_dtype, rc.mixed_precision->reduce_dtype);
  if (rc.grad_accum > 1) out += fmt::format(" + grad accum {}", rc.grad_accum);
  if (rc.activation_checkpointing) out += " + act ckpt";
  if (rc.checkpoint_resume_at) out += fmt::format(" + resume at step {}", *rc.checkpoint_resume_at);
  return out;
}

}  // namespace tdc::parity
