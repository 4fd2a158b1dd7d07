// DistributedDataParallel and replicate (torch.nn.parallel.DistributedDataParallel,
// torch.distributed._composable.replicate).
//
// At construction parameters and buffers are broadcast from rank 0 (after checking that every
// rank has the same parameter names, shapes and dtypes: a clear error otherwise). Gradients are
// bucketed in reverse registration order (bucket_cap_mb); a bucket's all-reduce (average) is
// launched as soon as all its gradients are ready — from the gradient-accumulator hooks, while
// the rest of backward still runs — and all buckets are waited for at the end of backward.
// no_sync() accumulates local gradients without communication; the next synchronised backward
// reduces the accumulated gradients. With find_unused_parameters, parameters the forward's
// autograd graph does not reach are marked ready (zero-filled) at the start of backward, and a
// parameter no rank used keeps its .grad as it was (None stays None, as PyTorch); without
// it, a parameter that got no gradient is an error at the end of backward (and at every later
// forward) naming it. Averages are SUM then divide on Gloo (tdc::comm's AVG emulation).
// Parameter names in messages are the wrapped module's FQNs (no "module." prefix).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tdc/comm/process_group.h"
#include "tdc/nn/module.h"

namespace tdc::ddp {

struct DDPOptions {
  double bucket_cap_mb = 25.0;  // the first bucket is capped at min(1 MiB, this), as PyTorch's
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;  // buffers broadcast from rank 0 before each forward
};

// What the last backward did, for tests and benchmarks.
struct BackwardStats {
  int buckets = 0;
  // Per bucket, in launch order: the bucket index and how many gradient-ready events were still
  // outstanding in the whole model when it launched (> 0 means it overlapped backward).
  std::vector<std::pair<int, int>> launches;
  bool finished = false;
};

class Reducer;

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(nn::ModulePtr module, comm::GroupPtr group = {}, DDPOptions options = {});
  ~DistributedDataParallel() override;
  nn::Tensors forward(const nn::Tensors& inputs) override;
  nn::ModulePtr clone_empty() const override;  // throws: copy the wrapped module instead
  nn::Module& module() { return *module_; }
  nn::ModulePtr module_ptr() { return module_; }

  // RAII: gradients accumulate locally while alive; the next backward outside it reduces them.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& d_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }  // auto guard = ddp.no_sync();
  // The current or last backward's stats (reset by the first gradient hook of each backward).
  const BackwardStats& last_backward() const;

 private:
  nn::ModulePtr module_;
  std::shared_ptr<Reducer> reducer_;
};

// Composable form: installs DDP's behaviour on `module` itself (hooks), returns it.
nn::Module& replicate(nn::Module& module, comm::GroupPtr group = {}, DDPOptions options = {});
// The stats / no_sync of a replicated module (throws if `module` was not replicated).
const BackwardStats& replicate_last_backward(nn::Module& module);
void replicate_set_requires_gradient_sync(nn::Module& module, bool sync);

// TP + DDP (torch.distributed.tensor.parallel.ddp._pre_dp_module_transform): makes a module whose
// parameters tensor parallel distributed ready for DDP over the data-parallel group. PyTorch must
// swap DTensor parameters for local tensors (DDP cannot bucket DTensors) and convert them back in
// forward hooks. In tdc a distributed parameter already *is* its local tensor, with the
// DTensorSpec beside it as metadata (tensor/module_params.h), so DDP buckets the local shards and
// averages each shard over the DP group, the spec staying as it was. What remains to do here is
// to check that every distributed parameter's local tensor still has its spec's local shape (a
// parameter replaced behind the spec's back is an error naming it); DDP's own construction check
// then finds ranks of the DP group holding different shard shapes. Returns the number of
// distributed parameters found.
int pre_dp_module_transform(nn::Module& module);

}  // namespace tdc::ddp
