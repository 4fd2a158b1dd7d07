// All-gather extensions (tdc/fsdp/all_gather_extension.h): registration, and FSDPParam's
// pre_all_gather -> all-gather -> post_all_gather path.
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "param.h"
#include "state.h"
#include "tdc/comm/collectives.h"
#include "tdc/fsdp/all_gather_extension.h"
#include "tdc/tensor/detail/layout.h"
#include "tdc/core/wrapper_tensor.h"

namespace tdc::fsdp {

void set_all_gather_extension(nn::Module& module, const std::string& fqn, AllGatherExtension extension) {
  if (!extension.post_all_gather || (!extension.pre_all_gather && !extension.pre_all_gather_v1)) {
    throw std::invalid_argument(fmt::format(
        "set_all_gather_extension('{}'): an extension needs post_all_gather and pre_all_gather (or pre_all_gather_v1)",
        fqn));
  }
  auto [owner, name] = module.owner_of(fqn);  // throws naming the FQN
  for (auto& s : states_in(module)) {
    for (auto& p : s->group().params()) {
      for (auto& [um, un] : p.uses()) {
        if (um == owner && un == name) {
          s->group().reset_sharded_params();
          p.set_extension(std::move(extension));
          return;
        }
      }
    }
  }
  throw std::invalid_argument(
      fmt::format("set_all_gather_extension: parameter '{}' of {} is not sharded by a fully_shard'ed module", fqn,
                  module.type_name()));
}

void FSDPParam::set_extension(AllGatherExtension extension) {
  free_unsharded();
  ext_ = std::make_shared<AllGatherExtension>(std::move(extension));
  ext_outputs_.clear();
  ext_to_free_.clear();
  unsharded_ = at::Tensor();
}

namespace {
// What the all-gather sends for one pre_all_gather output: the tensor itself when contiguous, else a
// contiguous copy. A wrapper tensor ([Note: wrapper tensors]) is copied into a plain buffer: as in
// PyTorch's copy-in (a foreach copy into the flat all-gather buffer), the copy runs on each part in
// turn, so the last part's values are what is gathered.
at::Tensor all_gather_buffer_of(const at::Tensor& t) {
  if (!core::is_wrapper(t)) return t.contiguous();
  at::Tensor plain = at::empty(t.sizes(), t.options());
  copy_quietly(plain, t);
  return plain;
}
}  // namespace

// Synchronous; copied into the kept buffers without a version bump (autograd saved aliases).
void FSDPParam::extension_all_gather(const MeshInfo& mesh_info, const MixedPrecisionPolicy& mp) {
  const int64_t n = mesh_info.shard_size;
  at::Tensor local = sharded_.detach();
  PreAllGatherResult pre =
      ext_->pre_all_gather ? ext_->pre_all_gather(local, mesh_info.shard_mesh, local_shape_,
                                                  tensor::detail::contiguous_stride(local_shape_), *uses_[0].first, mp)
                           : ext_->pre_all_gather_v1(local, mesh_info.shard_mesh);
  ext_meta_ = pre.metadata;
  record_gathered_version();
  bool fresh = ext_outputs_.size() != pre.tensors.size();
  for (size_t j = 0; !fresh && j < pre.tensors.size(); ++j) {
    fresh = ext_outputs_[j].size(0) != pre.tensors[j].size(0) * n ||
            ext_outputs_[j].scalar_type() != pre.tensors[j].scalar_type();
  }
  if (fresh) {
    ext_outputs_.clear();
    unsharded_ = at::Tensor();  // post_all_gather starts over (first call, no `out`)
    unsharded_counted_ = false;
  }
  for (size_t j = 0; j < pre.tensors.size(); ++j) {
    at::Tensor in = all_gather_buffer_of(pre.tensors[j]);
    std::vector<int64_t> shape = in.sizes().vec();
    if (shape.empty()) {
      throw std::invalid_argument(fmt::format("fully_shard: pre_all_gather of '{}' returned a scalar", fqn_));
    }
    shape[0] *= n;
    if (fresh) ext_outputs_.push_back(at::empty(shape, in.options()));
    alloc_storage(ext_outputs_[j]);
    if (n == 1) {
      copy_quietly(ext_outputs_[j], in);
    } else {
      at::Tensor out = at::empty(shape, in.options());
      comm::all_gather_into_tensor(out, in, mesh_info.shard_pg);
      copy_quietly(ext_outputs_[j], out);
    }
  }
}

void FSDPParam::extension_to_unsharded() {
  const bool first = !unsharded_.defined();
  if (!first) alloc_storage(unsharded_);
  PostAllGatherResult r = ext_->post_all_gather(ext_outputs_, ext_meta_, param_dtype_, first ? nullptr : &unsharded_);
  if (first) {
    at::Tensor u = r.unsharded;
    if (!u.defined()) {
      throw std::runtime_error(fmt::format("fully_shard: post_all_gather of '{}' returned no tensor", fqn_));
    }
    if (u.dim() == static_cast<int64_t>(local_shape_.size()) && u.size(0) > local_shape_[0]) {
      u = u.narrow(0, 0, local_shape_[0]);
    }
    if (u.sizes().vec() != local_shape_ || u.scalar_type() != param_dtype_) {
      throw std::runtime_error(fmt::format(
          "fully_shard: post_all_gather of '{}' returned a {} tensor of shape [{}]; the parameter is {} [{}]", fqn_,
          c10::toString(u.scalar_type()), fmt::join(u.sizes(), ", "), c10::toString(param_dtype_),
          fmt::join(local_shape_, ", ")));
    }
    unsharded_ = u;
    ext_to_free_ = r.to_free;
  }
  count_unsharded_bytes(true);
}

}  // namespace tdc::fsdp
