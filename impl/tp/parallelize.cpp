// Tensor parallel styles and parallelize_module (tdc/tp/parallelize.h).
#include "tdc/tp/parallelize.h"

#include <fnmatch.h>

#include <map>
#include <stdexcept>
#include <tuple>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/tensor/detail/layout.h"
#include "tdc/nn/layers.h"
#include "tdc/tensor/dtensor.h"
#include "tdc/tensor/module_params.h"

namespace tdc::tp {
namespace {

using tensor::DTensorSpec;
using tensor::Placements;
namespace detail = tensor::detail;

std::string where(const std::string& fqn, const nn::Module& m) {
  return fmt::format("'{}' ({})", fqn.empty() ? "(root)" : fqn, m.type_name());
}

std::string layout_str(const Placement& p) { return tensor::to_string(p); }

// The spec of an activation whose local tensor is `local`, laid out as `p` on the 1-D `mesh`. A
// sharded dim's global size is `global_dim_size` when known, else local size x mesh size (even
// shards, as PyTorch's from_local assumes).
DTensorSpec activation_spec(const at::Tensor& local, const DeviceMesh& mesh, const Placement& p,
                            int64_t global_dim_size = -1) {
  Placements ps = detail::normalize_placements({p}, mesh, local.dim(), "tensor parallel layout");
  std::vector<int64_t> shape = local.sizes().vec();
  if (const auto* s = std::get_if<Shard>(&ps[0])) {
    shape[s->dim] = global_dim_size >= 0 ? global_dim_size : shape[s->dim] * mesh.size();
  }
  DTensorSpec spec;
  spec.mesh = mesh;
  spec.placements = ps;
  spec.shape = shape;
  spec.stride = {};
  spec.dtype = local.scalar_type();
  std::vector<int64_t> st(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * shape[i + 1];
  spec.stride = st;
  return spec;
}

bool same(const Placement& a, const Placement& b, int64_t ndim) {
  auto norm = [ndim](const Placement& p) -> Placement {
    if (const auto* s = std::get_if<Shard>(&p)) return Shard{s->dim < 0 ? s->dim + ndim : s->dim};
    return p;
  };
  return norm(a) == norm(b);
}

// from -> to with the plain DTensor backward (the gradient after the conversion is laid out as
// `to`, and is converted back to `from`).
at::Tensor convert(const at::Tensor& x, const DeviceMesh& mesh, const Placement& from, const Placement& to,
                   int64_t global_dim_size = -1) {
  if (!x.defined() || same(from, to, x.dim())) return x;
  DTensorSpec spec = activation_spec(x, mesh, from, global_dim_size);
  Placements target = detail::normalize_placements({to}, mesh, x.dim(), "tensor parallel layout");
  return detail::redistribute_autograd(x, spec, target);
}

// from -> Replicate for a module whose local compute leaves partial input gradients (a Colwise
// linear): backward reduces the partial gradient to `from`'s gradient layout.
at::Tensor to_replicate_partial_grad(const at::Tensor& x, const DeviceMesh& mesh, const Placement& from) {
  if (!x.defined()) return x;
  DTensorSpec spec = activation_spec(x, mesh, from);
  return detail::redistribute_autograd(x, spec, {Replicate{}}, {Partial{}}, detail::grad_placements(spec.placements));
}

void check_activation_layout(const Placement& p, const char* what, const std::string& style, bool allow_partial) {
  if (std::holds_alternative<tensor::StridedShard>(p) || (!allow_partial && tensor::is_partial(p))) {
    throw std::invalid_argument(
        fmt::format("{}: {} {} is not supported (use Shard(d) or Replicate())", style, what, layout_str(p)));
  }
}

// Distributes direct parameter `name` of `m` on `mesh` as `placement` (the registered parameter
// becomes the local shard; the spec is recorded). A parameter already distributed the same way
// (a tied weight) is kept.
void distribute_param(nn::Module& m, const std::string& name, const DeviceMesh& mesh, const Placement& placement) {
  const at::Tensor* t = m.find_param(name);
  if (!t || !t->defined()) return;
  if (const DTensorSpec* spec = tensor::param_spec(m, name)) {
    (void)spec;  // validated: same mesh and placement
    return;
  }
  const int64_t src = mesh.mesh().flatten()[0].item<int64_t>();
  tensor::DTensor d =
      tensor::distribute_tensor(t->detach(), mesh, {placement}, /*broadcast_from_src=*/true, static_cast<int>(src));
  const bool rg = t->requires_grad();
  at::Tensor local = d.to_local().detach().clone(at::MemoryFormat::Contiguous).requires_grad_(rg);
  m.replace_param(name, local);
  tensor::set_param_spec(m, name, d.spec());
}

void check_param_free(const nn::Module& m, const std::string& name, const DeviceMesh& mesh, const Placement& placement,
                      const std::string& fqn, const std::string& style) {
  const at::Tensor* t = m.find_param(name);
  if (!t || !t->defined()) return;
  if (const DTensorSpec* spec = tensor::param_spec(m, name)) {
    const bool ok = spec->mesh == mesh && spec->placements.size() == 1 &&
                    same(spec->placements[0], placement, static_cast<int64_t>(spec->shape.size()));
    if (!ok) {
      throw std::invalid_argument(
          fmt::format("{} on {}: parameter '{}' is already distributed as {} on {}; it cannot also be {} on {}", style,
                      where(fqn, m), name, tensor::to_string(spec->placements), spec->mesh.to_string(),
                      layout_str(placement), mesh.to_string()));
    }
  }
  const int64_t ndim = t->dim();
  if (const auto* s = std::get_if<Shard>(&placement)) {
    const int64_t d = s->dim < 0 ? s->dim + ndim : s->dim;
    if (d < 0 || d >= ndim) {
      throw std::invalid_argument(fmt::format("{} on {}: parameter '{}' has {} dims; cannot shard dim {}", style,
                                              where(fqn, m), name, ndim, s->dim));
    }
  }
}

// The global size of a weight dim (from its spec when distributed, else its own size).
int64_t global_size(const nn::Module& m, const std::string& name, int64_t dim) {
  if (const DTensorSpec* spec = tensor::param_spec(m, name)) return spec->shape[dim];
  return m.find_param(name)->size(dim);
}

void require_one_input(const nn::Module& m, const nn::Tensors& inputs, const std::string& style) {
  if (inputs.empty() || !inputs[0].defined()) {
    throw std::invalid_argument(fmt::format("{}: module {} was called without an input tensor", style, m.type_name()));
  }
}

// ---------------------------------------------------------------- ColwiseParallel

void validate_colwise(const ColwiseParallel& s, const nn::Module& m, const DeviceMesh& mesh, const std::string& fqn) {
  check_activation_layout(s.input_layouts, "input_layouts", "ColwiseParallel", false);
  check_activation_layout(s.output_layouts, "output_layouts", "ColwiseParallel", false);
  if (dynamic_cast<const nn::Linear*>(&m)) {
    check_param_free(m, "weight", mesh, Shard{0}, fqn, "ColwiseParallel");
    check_param_free(m, "bias", mesh, Shard{0}, fqn, "ColwiseParallel");
  } else if (dynamic_cast<const nn::Embedding*>(&m)) {
    check_param_free(m, "weight", mesh, Shard{1}, fqn, "ColwiseParallel");
  } else {
    throw std::invalid_argument(fmt::format(
        "ColwiseParallel on {}: only Linear and Embedding modules can be parallelized column-wise", where(fqn, m)));
  }
}

void apply_colwise(const ColwiseParallel& s, nn::Module& m, const DeviceMesh& mesh) {
  const bool is_linear = dynamic_cast<nn::Linear*>(&m) != nullptr;
  if (is_linear) {
    distribute_param(m, "weight", mesh, Shard{0});
    distribute_param(m, "bias", mesh, Shard{0});
  } else {
    distribute_param(m, "weight", mesh, Shard{1});
  }
  const int64_t out_size = global_size(m, "weight", is_linear ? 0 : 1);
  m.register_forward_pre_hook(
      [s, mesh, is_linear](nn::Module& mod, const nn::Tensors& in) -> std::optional<nn::Tensors> {
        require_one_input(mod, in, "ColwiseParallel");
        nn::Tensors out = in;
        // A Linear's local matmul leaves a partial input gradient: reduced in backward. Embedding ids
        // carry no gradient.
        out[0] = is_linear ? to_replicate_partial_grad(in[0], mesh, s.input_layouts)
                           : convert(in[0], mesh, s.input_layouts, Replicate{});
        return out;
      });
  m.register_forward_hook(
      [s, mesh, out_size](nn::Module&, const nn::Tensors&, const nn::Tensors& outputs) -> std::optional<nn::Tensors> {
        nn::Tensors out = outputs;
        out[0] = convert(outputs[0], mesh, Shard{-1}, s.output_layouts, out_size);
        return out;
      });
}

// ---------------------------------------------------------------- RowwiseParallel

void validate_rowwise(const RowwiseParallel& s, const nn::Module& m, const DeviceMesh& mesh, const std::string& fqn) {
  check_activation_layout(s.input_layouts, "input_layouts", "RowwiseParallel", false);
  check_activation_layout(s.output_layouts, "output_layouts", "RowwiseParallel", false);
  if (dynamic_cast<const nn::Linear*>(&m)) {
    check_param_free(m, "weight", mesh, Shard{1}, fqn, "RowwiseParallel");
    check_param_free(m, "bias", mesh, Replicate{}, fqn, "RowwiseParallel");
  } else if (dynamic_cast<const nn::Embedding*>(&m)) {
    check_param_free(m, "weight", mesh, Shard{0}, fqn, "RowwiseParallel");
  } else {
    throw std::invalid_argument(fmt::format(
        "RowwiseParallel on {}: only Linear and Embedding modules can be parallelized row-wise", where(fqn, m)));
  }
}

void apply_rowwise(const RowwiseParallel& s, nn::Module& m, const DeviceMesh& mesh) {
  if (dynamic_cast<nn::Linear*>(&m)) {
    distribute_param(m, "weight", mesh, Shard{1});
    const int64_t in_size = global_size(m, "weight", 1);
    if (m.find_param("bias")) {
      distribute_param(m, "bias", mesh, Replicate{});
      // The bias joins the partial sums: b / n on each rank (DTensor's Replicate -> Partial),
      // gradient passed through whole.
      m.add_param_transform("bias", [mesh](const at::Tensor& b) {
        DTensorSpec spec = activation_spec(b, mesh, Replicate{});
        return detail::redistribute_autograd(b, spec, {Partial{}});
      });
    }
    m.register_forward_pre_hook(
        [s, mesh, in_size](nn::Module& mod, const nn::Tensors& in) -> std::optional<nn::Tensors> {
          require_one_input(mod, in, "RowwiseParallel");
          nn::Tensors out = in;
          const bool input_sharded_last =
              tensor::is_shard(s.input_layouts) && same(s.input_layouts, Shard{-1}, in[0].dim());
          out[0] = convert(in[0], mesh, s.input_layouts, Shard{-1}, input_sharded_last ? in_size : -1);
          return out;
        });
  } else {
    distribute_param(m, "weight", mesh, Shard{0});
    const tensor::ChunkRange range =
        tensor::chunk_range(global_size(m, "weight", 0), mesh.size(), mesh.get_local_rank());
    // The ids outside this rank's rows give zero rows (MaskPartial): mask kept between the hooks.
    auto mask = std::make_shared<at::Tensor>();
    m.register_forward_pre_hook(
        [s, mesh, range, mask](nn::Module& mod, const nn::Tensors& in) -> std::optional<nn::Tensors> {
          require_one_input(mod, in, "RowwiseParallel");
          at::Tensor ids = convert(in[0], mesh, s.input_layouts, Replicate{});
          *mask = (ids < range.offset).logical_or(ids >= range.offset + range.size);
          nn::Tensors out = in;
          out[0] = (ids - range.offset).masked_fill(*mask, 0);
          return out;
        });
    m.register_forward_hook(
        [mask](nn::Module&, const nn::Tensors&, const nn::Tensors& outputs) -> std::optional<nn::Tensors> {
          nn::Tensors out = outputs;
          out[0] = outputs[0].masked_fill(mask->unsqueeze(-1), 0.0);
          mask->reset();
          return out;
        });
  }
  m.register_forward_hook(
      [s, mesh](nn::Module&, const nn::Tensors&, const nn::Tensors& outputs) -> std::optional<nn::Tensors> {
        nn::Tensors out = outputs;
        out[0] = convert(outputs[0], mesh, Partial{}, s.output_layouts);
        return out;
      });
}

// ---------------------------------------------------------------- SequenceParallel

void apply_sequence_parallel(const SequenceParallel& s, nn::Module& m, const DeviceMesh& mesh) {
  (void)s;
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    const std::string name = item.key();
    if (!item.value().defined()) continue;
    distribute_param(m, name, mesh, Replicate{});
    // Each rank saw part of the sequence: its gradient is partial; all-reduced in backward.
    m.add_param_transform(name, [mesh](const at::Tensor& w) {
      DTensorSpec spec = activation_spec(w, mesh, Replicate{});
      return detail::redistribute_autograd(w, spec, {Replicate{}}, {Partial{}}, {Replicate{}});
    });
  }
}

// ---------------------------------------------------------------- PrepareModuleInput/Output

void validate_layout_lists(const std::vector<std::optional<Placement>>& from,
                           const std::vector<std::optional<Placement>>& to, const char* style, const char* from_name,
                           const char* to_name, const nn::Module& m, const std::string& fqn) {
  if (from.size() != to.size()) {
    throw std::invalid_argument(fmt::format("{} on {}: {} has {} entries but {} has {}", style, where(fqn, m),
                                            from_name, from.size(), to_name, to.size()));
  }
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i].has_value() != to[i].has_value()) {
      throw std::invalid_argument(fmt::format("{} on {}: entry {} is set in only one of {} and {}", style,
                                              where(fqn, m), i, from_name, to_name));
    }
    if (from[i]) check_activation_layout(*from[i], from_name, style, true);
    if (to[i]) check_activation_layout(*to[i], to_name, style, false);
  }
}

nn::Tensors convert_list(const nn::Tensors& xs, const std::vector<std::optional<Placement>>& from,
                         const std::vector<std::optional<Placement>>& to, const DeviceMesh& mesh, const nn::Module& m,
                         const char* style, const char* what) {
  if (xs.size() < from.size()) {
    throw std::invalid_argument(fmt::format("{}: module {} got {} {} but the style lists {} layouts", style,
                                            m.type_name(), xs.size(), what, from.size()));
  }
  nn::Tensors out = xs;
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] && xs[i].defined()) out[i] = convert(xs[i], mesh, *from[i], *to[i]);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------- ParallelStyle

ParallelStyle::ParallelStyle(ColwiseParallel s)
    : name_("ColwiseParallel"),
      validate_([s](const nn::Module& m, const DeviceMesh& mesh, const std::string& fqn) {
        validate_colwise(s, m, mesh, fqn);
      }),
      apply_([s](nn::Module& m, const DeviceMesh& mesh, const std::string&) { apply_colwise(s, m, mesh); }) {}

ParallelStyle::ParallelStyle(RowwiseParallel s)
    : name_("RowwiseParallel"),
      validate_([s](const nn::Module& m, const DeviceMesh& mesh, const std::string& fqn) {
        validate_rowwise(s, m, mesh, fqn);
      }),
      apply_([s](nn::Module& m, const DeviceMesh& mesh, const std::string&) { apply_rowwise(s, m, mesh); }) {}

ParallelStyle::ParallelStyle(SequenceParallel s)
    : name_("SequenceParallel"),
      validate_([s](const nn::Module& m, const DeviceMesh& mesh, const std::string& fqn) {
        if (s.sequence_dim < 0) {
          throw std::invalid_argument(
              fmt::format("SequenceParallel on {}: sequence_dim {} must be >= 0", where(fqn, m), s.sequence_dim));
        }
        for (const auto& item : m.named_parameters(false))
          check_param_free(m, item.key(), mesh, Replicate{}, fqn, "SequenceParallel");
      }),
      apply_([s](nn::Module& m, const DeviceMesh& mesh, const std::string&) { apply_sequence_parallel(s, m, mesh); }) {}

ParallelStyle::ParallelStyle(PrepareModuleInput s)
    : name_("PrepareModuleInput"),
      validate_([s](const nn::Module& m, const DeviceMesh&, const std::string& fqn) {
        validate_layout_lists(s.input_layouts, s.desired_input_layouts, "PrepareModuleInput", "input_layouts",
                              "desired_input_layouts", m, fqn);
      }),
      apply_([s](nn::Module& m, const DeviceMesh& mesh, const std::string&) {
        m.register_forward_pre_hook([s, mesh](nn::Module& mod, const nn::Tensors& in) -> std::optional<nn::Tensors> {
          return convert_list(in, s.input_layouts, s.desired_input_layouts, mesh, mod, "PrepareModuleInput", "inputs");
        });
      }) {}

ParallelStyle::ParallelStyle(PrepareModuleOutput s)
    : name_("PrepareModuleOutput"),
      validate_([s](const nn::Module& m, const DeviceMesh&, const std::string& fqn) {
        validate_layout_lists(s.output_layouts, s.desired_output_layouts, "PrepareModuleOutput", "output_layouts",
                              "desired_output_layouts", m, fqn);
      }),
      apply_([s](nn::Module& m, const DeviceMesh& mesh, const std::string&) {
        m.register_forward_hook(
            [s, mesh](nn::Module& mod, const nn::Tensors&, const nn::Tensors& outputs) -> std::optional<nn::Tensors> {
              return convert_list(outputs, s.output_layouts, s.desired_output_layouts, mesh, mod, "PrepareModuleOutput",
                                  "outputs");
            });
      }) {}

ParallelStyle::ParallelStyle(std::string name, ApplyFn apply)
    : name_(std::move(name)),
      validate_([](const nn::Module&, const DeviceMesh&, const std::string&) {}),
      apply_(std::move(apply)) {
  if (!apply_) throw std::invalid_argument("ParallelStyle '" + name_ + "': empty apply function");
}

void ParallelStyle::validate(const nn::Module& module, const DeviceMesh& mesh, const std::string& fqn) const {
  validate_(module, mesh, fqn);
}

void ParallelStyle::apply(nn::Module& module, const DeviceMesh& mesh, const std::string& fqn) const {
  apply_(module, mesh, fqn);
}

// ---------------------------------------------------------------- plan matching

namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// Depth-first: the modules under `m` (at `prefix`) matching parts[i..]. On a dead end, `miss`
// records the deepest place nothing matched (for the error message).
void match(nn::Module& m, const std::string& prefix, const std::vector<std::string>& parts, size_t i,
           std::vector<std::pair<std::string, nn::Module*>>& out, std::string& miss, size_t& miss_depth) {
  if (i == parts.size()) {
    out.emplace_back(prefix, &m);
    return;
  }
  bool any = false;
  std::vector<std::string> names;
  for (auto& [name, child] : m.named_children_tdc()) {
    names.push_back(name);
    if (fnmatch(parts[i].c_str(), name.c_str(), 0) == 0) {
      any = true;
      match(*child, prefix.empty() ? name : prefix + "." + name, parts, i + 1, out, miss, miss_depth);
    }
  }
  if (!any && (miss.empty() || i > miss_depth)) {
    miss_depth = i;
    miss = fmt::format("nothing matches '{}' under {} (type {}; children: {})", parts[i],
                       prefix.empty() ? "the root" : "'" + prefix + "'", m.type_name(),
                       names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", ")));
  }
}

}  // namespace

std::vector<std::pair<std::string, nn::Module*>> match_modules(nn::Module& root, const std::string& pattern) {
  std::vector<std::pair<std::string, nn::Module*>> out;
  if (pattern.empty()) return out;
  std::string miss;
  size_t depth = 0;
  match(root, "", split_dots(pattern), 0, out, miss, depth);
  return out;
}

nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan) {
  if (mesh.ndim() != 1) {
    throw std::invalid_argument(fmt::format(
        "parallelize_module: tensor parallel takes a 1-D mesh, got {} dims ({}); slice the TP dim, e.g. mesh[\"tp\"]",
        mesh.ndim(), mesh.to_string()));
  }
  // Resolve and validate everything before changing anything.
  std::vector<std::tuple<std::string, nn::Module*, const ParallelStyle*>> todo;
  std::map<const nn::Module*, std::string> sharded_by;  // module -> the plan key that shards it
  for (const auto& [key, style] : plan) {
    if (key.empty()) {
      throw std::invalid_argument(fmt::format(
          "parallelize_module: empty plan key for {} (to parallelize the module itself, pass the style alone)",
          style.name()));
    }
    std::vector<std::pair<std::string, nn::Module*>> found;
    std::string miss;
    size_t depth = 0;
    match(module, "", split_dots(key), 0, found, miss, depth);
    if (found.empty()) {
      throw std::invalid_argument(fmt::format("parallelize_module: plan key '{}' ({}) matches no submodule of {}: {}",
                                              key, style.name(), module.type_name(), miss));
    }
    for (auto& [fqn, m] : found) {
      style.validate(*m, mesh, fqn);
      const bool shards =
          style.name() == "ColwiseParallel" || style.name() == "RowwiseParallel" || style.name() == "SequenceParallel";
      if (shards) {
        auto [it, fresh] = sharded_by.emplace(m, key);
        if (!fresh) {
          throw std::invalid_argument(fmt::format(
              "parallelize_module: module '{}' ({}) is matched by plan keys '{}' and '{}'; a module's parameters "
              "can be distributed by one style only",
              fqn, m->type_name(), it->second, key));
        }
      }
      todo.emplace_back(fqn, m, &style);
    }
  }
  for (auto& [fqn, m, style] : todo) style->apply(*m, mesh, fqn);
  return module;
}

nn::Module& parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelStyle& style) {
  if (mesh.ndim() != 1) {
    throw std::invalid_argument(fmt::format(
        "parallelize_module: tensor parallel takes a 1-D mesh, got {} dims ({}); slice the TP dim, e.g. mesh[\"tp\"]",
        mesh.ndim(), mesh.to_string()));
  }
  style.validate(module, mesh, "");
  style.apply(module, mesh, "");
  return module;
}

}  // namespace tdc::tp
