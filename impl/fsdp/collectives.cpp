// FSDP2's collectives (collectives.h).
#include "collectives.h"

#include <map>
#include <memory>

#include <ATen/ATen.h>

#include "tdc/comm/argument_checks.h"
#include "tdc/core/cpu_block_cache.h"

namespace tdc::fsdp {

// [Note: FSDP's collectives skip the argument checks after the first] tdc::comm exchanges a
// fingerprint of every collective's arguments across ranks before it (a blocking round trip:
// the FSDP benchmark measured it at a third of a step). A group's all-gather and reduce-scatter
// buffers have the same layout at every step, so each group checks its first all-gather and its
// first reduce-scatter and runs the later ones without (as DDP's buckets do). Extension
// all-gathers, whose tensors user hooks make, are always checked.

namespace {

int64_t padded_total(const std::vector<FSDPParam>& params, const std::vector<size_t>& idx) {
  int64_t total = 0;
  for (size_t i : idx) total += params[i].padded_numel();
  return total;
}

// One pending Work for several collectives: waits for all of them.
comm::Work chain(comm::Work first, comm::Work second) {
  auto a = std::make_shared<comm::Work>(std::move(first));
  auto b = std::make_shared<comm::Work>(std::move(second));
  return comm::Work({}, [a, b] {
    a->wait();
    b->wait();
  });
}

}  // namespace

AllGatherResult foreach_all_gather(std::vector<FSDPParam>& params, const MeshInfo& mesh_info,
                                   const MixedPrecisionPolicy& mp, bool async_op, CollectiveChecks& checks) {
  for (auto& p : params) {
    if (p.has_extension()) p.extension_all_gather(mesh_info, mp);
  }
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].has_extension()) by_dtype[params[i].param_dtype()].push_back(i);
  }
  AllGatherResult result;
  for (auto& [dtype, idx] : by_dtype) {
    const int64_t total = padded_total(params, idx);
    const auto options = at::TensorOptions().dtype(dtype).device(params[idx[0]].sharded().device());
    // The input is the rank's own block of the output (an in-place all-gather, as PyTorch's
    // FSDP2 lays it out): the shards are copied in once, and the collective leaves them there.
    at::Tensor out = core::empty_reusing({total * mesh_info.shard_size}, options);
    at::Tensor in = out.narrow(0, mesh_info.shard_rank * total, total);
    int64_t off = 0;
    for (size_t i : idx) {
      FSDPParam& p = params[i];
      in.narrow(0, off, p.shard_numel()).copy_(p.all_gather_input());
      in.narrow(0, off + p.shard_numel(), p.padded_numel() - p.shard_numel()).zero_();  // the padding
      off += p.padded_numel();
      p.record_gathered_version();
    }
    if (mesh_info.shard_size > 1) {
      comm::ScopedArgumentChecks scoped(checks.all_gather ? false : comm::argument_checks());
      checks.all_gather = true;
      comm::Work w = comm::all_gather_into_tensor(out, in, mesh_info.shard_pg, async_op);
      if (async_op) result.work = chain(std::move(result.work), std::move(w));
    }
    result.buckets.push_back({idx, out});
  }
  return result;
}

void foreach_all_gather_copy_out(AllGatherResult& result, std::vector<FSDPParam>& params, const MeshInfo& mesh_info) {
  result.work.wait();
  for (auto& p : params) {
    if (p.has_extension()) p.extension_to_unsharded();
  }
  for (auto& bucket : result.buckets) {
    at::Tensor grid = bucket.output.view({mesh_info.shard_size, padded_total(params, bucket.params)});
    int64_t off = 0;
    for (size_t i : bucket.params) {
      FSDPParam& p = params[i];
      p.to_unsharded(grid.narrow(1, off, p.padded_numel()), mesh_info.shard_size);
      off += p.padded_numel();
    }
  }
}

std::vector<at::Tensor> foreach_reduce(std::vector<FSDPParam>& params, const std::vector<at::Tensor>& grads,
                                       const MeshInfo& mesh_info, std::optional<at::ScalarType> reduce_dtype,
                                       CollectiveChecks& checks) {
  ReduceScatterResult result = foreach_reduce_scatter(params, grads, mesh_info, reduce_dtype, checks, false);
  return foreach_reduce_finish(result, params, mesh_info);
}

ReduceScatterResult foreach_reduce_scatter(std::vector<FSDPParam>& params, const std::vector<at::Tensor>& grads,
                                           const MeshInfo& mesh_info, std::optional<at::ScalarType> reduce_dtype,
                                           CollectiveChecks& checks, bool async_op) {
  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < params.size(); ++i) {
    FSDPParam& p = params[i];
    if (!p.requires_grad()) continue;
    if (!grads[i].defined() && !p.has_unsynced_grad()) continue;
    by_dtype[reduce_dtype.value_or(p.param_dtype())].push_back(i);
  }
  const int64_t n = mesh_info.shard_size;
  ReduceScatterResult result;
  for (auto& [dtype, idx] : by_dtype) {
    const int64_t total = padded_total(params, idx);
    // Copy-in: rank r's chunk of every gradient into row r, padded (with zeros) like the all-gather.
    at::Tensor in =
        core::empty_reusing({n, total}, at::TensorOptions().dtype(dtype).device(params[idx[0]].sharded().device()));
    int64_t off = 0;
    for (size_t i : idx) {
      FSDPParam& p = params[i];
      at::Tensor rows = p.rows_of(p.take_grad_to_reduce(grads[i]), dtype);
      for (int64_t r = 0; r < n; ++r) {
        tensor::ChunkRange cr = tensor::chunk_range(p.rows(), n, r);
        const int64_t filled = cr.size * p.row_numel();
        if (cr.size > 0) in[r].narrow(0, off, filled).copy_(rows.narrow(0, cr.offset, cr.size).reshape({-1}));
        in[r].narrow(0, off + filled, p.padded_numel() - filled).zero_();
      }
      off += p.padded_numel();
    }
    at::Tensor reduced = n == 1 ? in.reshape({total}) : core::empty_reusing({total}, in.options());
    result.argument_checks = checks.reduce_scatter ? false : comm::argument_checks();
    comm::ScopedArgumentChecks scoped(result.argument_checks);
    checks.reduce_scatter = true;
    if (n > 1) {
      comm::Work w =
          comm::reduce_scatter_tensor(reduced, in.reshape({-1}), comm::ReduceOp::SUM, mesh_info.shard_pg, async_op);
      if (async_op) result.work = chain(std::move(result.work), std::move(w));
    }
    result.buckets.push_back({idx, in, reduced});
  }
  return result;
}

std::vector<at::Tensor> foreach_reduce_finish(ReduceScatterResult& result, std::vector<FSDPParam>& params,
                                              const MeshInfo& mesh_info) {
  result.work.wait();
  comm::ScopedArgumentChecks scoped(result.argument_checks);
  std::vector<at::Tensor> out(params.size());
  const double world = static_cast<double>(mesh_info.data_parallel_size());
  for (auto& bucket : result.buckets) {
    at::Tensor& reduced = bucket.reduced;
    if (mesh_info.replicate_size > 1) comm::all_reduce(reduced, comm::ReduceOp::SUM, mesh_info.replicate_pg);
    if (world > 1) reduced.div_(world);
    int64_t off = 0;
    for (size_t i : bucket.params) {
      FSDPParam& p = params[i];
      out[i] = p.sharded_grad(reduced.narrow(0, off, p.shard_numel()));
      off += p.padded_numel();
    }
  }
  result.buckets.clear();
  return out;
}

}  // namespace tdc::fsdp
