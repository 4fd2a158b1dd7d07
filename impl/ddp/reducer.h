// Internal to impl/ddp: the Reducer, the part of DDP that both DistributedDataParallel and
// replicate() install on a module (after PyTorch's torch/csrc/distributed/c10d/reducer.cpp).
//
// Lifecycle per backward (asserted at transitions):
//   IDLE --first ready hook--> IN_BACKWARD --end-of-backward callback--> IDLE
// The first gradient-accumulator post hook of a backward queues the end-of-backward callback
// (Engine::queue_callback), marks the unused parameters found after forward ready (zero-filled),
// and from then on every hook copies its parameter's accumulated .grad into its bucket; a bucket
// whose gradients are all in is launched (async all-reduce, AVG) once every earlier bucket has
// been, so all ranks launch the same buckets in the same order. The callback waits for every
// bucket and writes the averaged values back into .grad.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/comm/collectives.h"
#include "tdc/comm/process_group.h"
#include "tdc/ddp/ddp.h"
#include "tdc/libtorch_compat.h"
#include "tdc/nn/module.h"

namespace torch::autograd {
struct Node;
}

namespace tdc::ddp {

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // Checks that every rank has the same parameters and buffers (names, dtypes, shapes), broadcasts
  // them from rank 0, builds the buckets and installs the hooks. `who` names the API in messages.
  // Collective over `group`.
  static std::shared_ptr<Reducer> create(nn::Module& module, comm::GroupPtr group, DDPOptions options, std::string who);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Before the module's forward: rethrows a failed previous backward's error; broadcasts buffers
  // from rank 0 when broadcast_buffers.
  void pre_forward();
  // After the module's forward: with find_unused_parameters, walks the autograd graph from the
  // outputs and records the parameters it does not reach.
  void post_forward(const nn::Tensors& outputs);

  void set_sync(bool sync);
  bool sync() const { return sync_; }
  const BackwardStats& stats() const { return stats_; }

  // Called by the gradient-accumulator post hook of parameter `index`.
  void mark_ready(size_t index);

 private:
  enum class State { IDLE, IN_BACKWARD };
  struct Bucket {
    std::vector<size_t> vars;      // indices into params_, in bucket order
    std::vector<int64_t> offsets;  // element offset of each var in flat
    at::Tensor flat;
    int pending = 0;  // vars not yet ready in this backward
    bool launched = false;
    comm::Work work;
  };

  Reducer(nn::Module& module, comm::GroupPtr group, DDPOptions options, std::string who);
  void check_and_broadcast();
  void build_buckets();
  void install_hooks();
  void broadcast_buffers();
  void begin_backward();                 // under mu_
  void mark_ready_locked(size_t index);  // under mu_
  void launch_ready_buckets();           // under mu_
  void finalize_backward();              // end-of-backward callback

  nn::Module& module_;
  comm::GroupPtr group_;
  DDPOptions options_;
  std::string who_;

  // Parameters that require grad (deduplicated, registration order) and their FQNs in module_.
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  // Kept alive: autograd runs a gradient accumulator's post hook only while the accumulator node
  // itself exists, and a parameter holds its accumulator only weakly.
  std::vector<compat::NodePtr> accumulators_;  // [Note: autograd Node pointers]
  std::vector<uintptr_t> hook_keys_;
  std::vector<size_t> bucket_of_;  // param index -> bucket index
  std::vector<size_t> slot_of_;    // param index -> position in its bucket
  std::vector<Bucket> buckets_;

  std::mutex mu_;
  State state_ = State::IDLE;
  bool sync_ = true;
  std::vector<char> ready_;
  size_t ready_count_ = 0;
  size_t next_bucket_ = 0;      // buckets launch in index order
  std::vector<size_t> unused_;  // found by post_forward, marked ready by begin_backward
  // With find_unused_parameters: 1 where this rank's forward used the parameter (this backward);
  // summed over the group at the end of backward, 0 = unused on every rank (its .grad is left
  // as it was, None if it was None: PyTorch's globally-unused rule).
  std::vector<int32_t> locally_used_;
  std::string error_;  // a failed backward's message, rethrown by pre_forward
  BackwardStats stats_;
};

}  // namespace tdc::ddp
