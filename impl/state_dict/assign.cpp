// Checked, all-or-nothing assignment of state-dict values to live tensors (assign.h).
#include "assign.h"

#include <set>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common.h"
#include "tdc/checkpoint/errors.h"
#include "tdc/comm/collectives.h"
#include "tdc/tensor/detail/layout.h"
#include "tdc/comm/gather_strings.h"

namespace tdc::checkpoint::detail {
namespace {

// The rank's shard of `full` (the whole global tensor) laid out as `spec` on this rank.
at::Tensor local_slice(const at::Tensor& full, const tensor::DTensorSpec& spec) {
  const auto runs = tensor::detail::local_runs_at(spec, spec.mesh.get_coordinate());
  at::Tensor out = full;
  for (size_t d = 0; d < runs.size(); ++d) {
    if (runs[d].size() == 1) {
      out = out.narrow(static_cast<int64_t>(d), runs[d][0].start, runs[d][0].len);
      continue;
    }
    std::vector<at::Tensor> pieces;
    for (const auto& r : runs[d]) pieces.push_back(out.narrow(static_cast<int64_t>(d), r.start, r.len));
    out = at::cat(pieces, static_cast<int64_t>(d));
  }
  return out;
}

bool is_tensor_value(const Value& v) { return !std::holds_alternative<nlohmann::json>(v); }

// Why `given` cannot be assigned to `target` (key named by the caller), or nullopt.
std::optional<std::string> mismatch(const Value& target, const Value& given, bool broadcast) {
  if (!is_tensor_value(given)) return fmt::format("expected a tensor, got a {}", kind_name(given));
  const auto tshape = global_shape(target), gshape = global_shape(given);
  const auto tdtype = local_tensor(target).scalar_type(), gdtype = local_tensor(given).scalar_type();
  if (gdtype != tdtype) {
    return fmt::format("dtype torch.{} in the state dict, torch.{} in the target", c10::getDtypeNames(gdtype).first,
                       c10::getDtypeNames(tdtype).first);
  }
  if (gshape != tshape) {
    return fmt::format("shape {} in the state dict, {} in the target", shape_str(gshape), shape_str(tshape));
  }
  if (const auto* g = std::get_if<tensor::DTensor>(&given)) {
    if (broadcast) return std::string("broadcast_from_rank0 needs full tensors, got a ") + kind_name(given);
    const auto* t = std::get_if<tensor::DTensor>(&target);
    if (t && !(g->device_mesh() == t->device_mesh())) {
      return fmt::format(
          "{} in the state dict, {} in the target: a sharded value must be on the target's mesh "
          "(load a checkpoint to reshard across meshes)",
          kind_name(given), kind_name(target));
    }
    for (const auto& p : g->placements()) {
      if (tensor::is_partial(p)) return fmt::format("a Partial value ({}) cannot be assigned", kind_name(given));
    }
  }
  return std::nullopt;
}

std::string signature_of(const Value& v) {
  if (const auto* d = std::get_if<tensor::DTensor>(&v)) return "D" + tensor::to_string(d->placements());
  return "T";
}

at::Tensor to_target_layout(const Value& target, const Value& given) {
  const at::Tensor& dst = local_tensor(target);
  at::Tensor src;
  if (const auto* g = std::get_if<tensor::DTensor>(&given)) {
    tensor::DTensor detached(g->to_local().detach(), g->spec());
    if (const auto* t = std::get_if<tensor::DTensor>(&target)) {
      src = detached.redistribute(t->placements()).to_local();
    } else {
      src = detached.full_tensor();
    }
  } else {
    const at::Tensor full = std::get<at::Tensor>(given).detach();
    src = std::holds_alternative<tensor::DTensor>(target) ? local_slice(full, std::get<tensor::DTensor>(target).spec())
                                                          : full;
  }
  return src.to(dst.device());
}

}  // namespace

std::vector<Assignment> stage(const std::string& who, const StateDict& targets, const StateDict& given,
                              const StateDictOptions& options) {
  const comm::GroupPtr world = resolve_group(nullptr);
  const int rank = group_rank(world);
  const bool broadcast = options.broadcast_from_rank0;
  const bool decides = !broadcast || rank == 0;  // ranks whose `given` counts

  // Phase 1: check every key, every value, locally; then agree (so no rank starts a collective
  // that another rank will not join).
  std::optional<std::string> error;
  std::vector<std::string> present;
  std::string signature;
  if (decides) {
    std::vector<std::string> missing, unexpected, bad;
    for (const auto& [key, target] : targets) {
      if (!given.contains(key)) {
        missing.push_back(key);
        continue;
      }
      if (auto why = mismatch(target, given.at(key), broadcast)) {
        bad.push_back(fmt::format("'{}': {}", key, *why));
        continue;
      }
      present.push_back(key);
      signature += key + "=" + (broadcast ? "B" : signature_of(given.at(key))) + ";";
    }
    for (const auto& [key, value] : given) {
      if (is_tensor_value(value) && !targets.contains(key)) unexpected.push_back(key);
    }
    std::vector<std::string> parts;
    if (options.strict && !missing.empty()) parts.push_back(fmt::format("missing keys: {}", fmt::join(missing, ", ")));
    if (options.strict && !unexpected.empty()) {
      parts.push_back(fmt::format("unexpected keys: {}", fmt::join(unexpected, ", ")));
    }
    if (!bad.empty()) parts.push_back(fmt::format("mismatched values: {}", fmt::join(bad, "; ")));
    if (!parts.empty()) error = fmt::format("{}", fmt::join(parts, "; "));
  }
  if (broadcast) {
    agree(who, error, "", world);
    const auto lists = comm::all_gather_strings(signature, world);  // rank 0's keys decide
    signature = lists[0];
    present.clear();
    for (size_t at = 0; at < signature.size();) {
      const size_t eq = signature.find('=', at), end = signature.find(';', at);
      present.push_back(signature.substr(at, eq - at));
      at = end + 1;
    }
  } else {
    agree(who, error, signature, world);
  }

  // Phase 2: convert (collectives in key order, the same on every rank).
  std::vector<Assignment> out;
  const std::set<std::string> wanted(present.begin(), present.end());
  for (const auto& [key, target] : targets) {
    if (!wanted.contains(key)) continue;
    const at::Tensor& dst = local_tensor(target);
    at::Tensor src;
    if (broadcast) {
      at::Tensor full = rank == 0 ? std::get<at::Tensor>(given.at(key)).detach().to(dst.device()).contiguous()
                                  : at::empty(global_shape(target), dst.options().requires_grad(false));
      if (world && world->size() > 1) comm::broadcast(full, 0, world);
      src = to_target_layout(target, Value(full));
    } else {
      src = to_target_layout(target, given.at(key));
    }
    out.push_back({key, dst, src});
  }
  return out;
}

void commit(const std::vector<Assignment>& assignments) {
  c10::NoGradGuard no_grad;
  for (const auto& a : assignments) a.dst.copy_(a.src);
}

}  // namespace tdc::checkpoint::detail
