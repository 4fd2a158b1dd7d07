// FSDPState (state.h): hooks, lazy init of the root, prefetch, TrainingState; the registry.
#include "state.h"

#include "tdc/fsdp/testing.h"

#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

namespace tdc::fsdp {

// ------------------------------------------------------------------ registry

namespace {
std::mutex g_registry_mu;
std::unordered_map<const nn::Module*, std::weak_ptr<FSDPState>>& registry() {
  static std::unordered_map<const nn::Module*, std::weak_ptr<FSDPState>> r;
  return r;
}
}  // namespace

std::shared_ptr<FSDPState> state_of(const nn::Module& module) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = registry().find(&module);
  if (it == registry().end()) return nullptr;
  return it->second.lock();
}

void register_state(nn::Module& module, std::shared_ptr<FSDPState> state) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  registry()[&module] = std::move(state);
}

std::vector<std::shared_ptr<FSDPState>> states_in(const nn::Module& module) {
  std::vector<std::shared_ptr<FSDPState>> out;
  for (auto& [name, m] : module.named_modules_tdc()) {
    if (auto s = state_of(*m)) out.push_back(std::move(s));
  }
  return out;
}

// ------------------------------------------------------------------ the group's autograd node

namespace {

struct StateRef : torch::CustomClassHolder {
  explicit StateRef(std::shared_ptr<FSDPState> s) : state(std::move(s)) {}
  std::shared_ptr<FSDPState> state;
};

// [Note: FSDP and autograd] One node per group and forward call. Its inputs are the shards: they
// are passed only so that the node becomes their grad_fn's consumer, and its backward's outputs
// (the reduce-scattered gradients, one per shard) accumulate into the shards' .grad. forward
// ignores them and hands out the unsharded tensors, detached: the module computes with those (as
// parameter substitutes), so their gradients arrive here. The first backward output belongs to
// the StateRef argument, which is not a tensor: always undefined.
struct UnshardFunction : torch::autograd::Function<UnshardFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<StateRef> ref,
                                                at::TensorList shards) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(ref);
    torch::autograd::variable_list out;
    for (auto& p : ref->state->group().params()) out.push_back(p.unsharded().detach());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto capsule = ctx->saved_data["state"].toCapsule();
    auto* ref = static_cast<StateRef*>(capsule.get());
    std::vector<at::Tensor> shard_grads = ref->state->post_backward(grads);
    torch::autograd::variable_list out{at::Tensor()};
    out.insert(out.end(), shard_grads.begin(), shard_grads.end());
    return out;
  }
};

nn::Tensors cast_floating(nn::Tensors xs, at::ScalarType dtype) {
  for (auto& x : xs) {
    if (x.defined() && at::isFloatingType(x.scalar_type()) && x.scalar_type() != dtype) x = x.to(dtype);
  }
  return xs;
}

std::string label_of(const std::string& fqn, const nn::Module& m) {
  return fqn.empty() ? fmt::format("<root> ({})", m.type_name()) : fmt::format("{} ({})", fqn, m.type_name());
}

}  // namespace

// ------------------------------------------------------------------ FSDPState

FSDPState::FSDPState(nn::Module& module, ParamGroup group)
    : module_(&module), group_(std::move(group)), label_(fmt::format("({})", module.type_name())) {
  group_.set_label(label_);
}

void FSDPState::register_hooks() {
  auto self = shared_from_this();
  std::weak_ptr<FSDPState> weak = self;
  module_->register_forward_pre_hook(
      [self](nn::Module&, const nn::Tensors& in) -> std::optional<nn::Tensors> { return self->pre_forward(in); });
  module_->register_forward_hook(
      [weak](nn::Module&, const nn::Tensors&, const nn::Tensors& out) -> std::optional<nn::Tensors> {
        if (auto s = weak.lock()) return s->post_forward(out);
        return std::nullopt;
      });
}

// The first fully_shard'ed module to run forward is the root of every state below it. The root
// keeps its parameters after forward: they would be gathered again at once for backward.
void FSDPState::lazy_init() {
  if (is_root_) return;
  is_root_ = true;
  group_.reshard_after_forward = false;
  for (auto& [fqn, m] : module_->named_modules_tdc()) {
    auto s = state_of(*m);
    if (!s) continue;
    tree_.push_back(s);
    s->label_ = label_of(fqn, *m);
    s->group_.set_label(s->label_);
    if (s.get() != this) s->is_root_ = false;
    s->root_ = weak_from_this();
  }
}

void FSDPState::prefetch_unshard(const std::vector<nn::Module*>& modules) {
  for (nn::Module* m : modules) {
    if (auto s = state_of(*m)) s->group_.unshard(/*async_op=*/true);
  }
}

// [Note: implicit prefetch] Without prefetch lists, FSDP issues a module's all-gather when that
// module starts, and nothing else runs until it arrives. Like PyTorch's FSDP2 in backward, tdc
// prefetches by default; in forward too, which PyTorch leaves to its CUDA streams (the all-gather
// of block i+1 is queued while block i's kernels run), and which on a synchronous CPU backend has
// to be an explicit async all-gather:
// - forward: the root records the order in which states start forward with grad enabled. When a
//   state starts at the same place as in the last iteration, the state that followed it then is
//   gathered asynchronously before this one computes;
// - backward: states are recorded at post-forward (with multiplicity, as PyTorch's
//   post_forward_order); a state starting backward prefetches the one recorded just before its
//   own latest record (the next to run backward).
// Every rank runs the same modules in the same order (FSDP's premise), so every rank issues the
// same collectives in the same order. A prefetched module that does not run has its all-gather
// finished at the end of backward ([Note: a mistargeted prefetch ends with backward]) and is
// resharded there like any other. An explicit prefetch list replaces the implicit choice. The
// values gathered are the same, so the numerics do not change; forward recompute (activation
// checkpointing, inside backward) neither records nor prefetches.
void FSDPState::record_pre_forward_and_prefetch() {
  auto root = root_.lock();
  if (!root || !at::GradMode::is_enabled() || backward_in_flight()) return;
  if (root.get() == this) {
    root->last_pre_forward_order_ = std::move(root->pre_forward_order_);
    root->pre_forward_order_.clear();
  }
  std::vector<FSDPState*>& now = root->pre_forward_order_;
  const std::vector<FSDPState*>& last = root->last_pre_forward_order_;
  now.push_back(this);
  const size_t at = now.size() - 1;
  if (!forward_prefetch_.empty() || at + 1 >= last.size() || last[at] != this) return;
  root->prefetch_in_tree(last[at + 1]);
}

void FSDPState::record_post_forward() {
  auto root = root_.lock();
  if (!root || !at::GradMode::is_enabled() || backward_in_flight()) return;
  post_forward_indices_.push_back(root->post_forward_order_.size());
  root->post_forward_order_.push_back(this);
}

void FSDPState::implicit_backward_prefetch() {
  auto root = root_.lock();
  if (!root || !backward_prefetch_.empty() || post_forward_indices_.empty()) return;
  const size_t at = post_forward_indices_.back();
  post_forward_indices_.pop_back();
  if (at == 0 || at > root->post_forward_order_.size()) return;
  root->prefetch_in_tree(root->post_forward_order_[at - 1]);
}

// The recorded orders hold plain pointers; a state is reached through the root's tree, so one
// that is gone is never touched.
void FSDPState::prefetch_in_tree(const FSDPState* target) {
  for (auto& w : tree_) {
    auto s = w.lock();
    if (s.get() == target) s->group_.unshard(/*async_op=*/true);
  }
}

void FSDPState::apply_unshard_function() {
  torch::autograd::variable_list shards;
  for (auto& p : group_.params()) shards.push_back(p.sharded());
  torch::autograd::variable_list unsharded =
      UnshardFunction::apply(c10::make_intrusive<StateRef>(shared_from_this()), at::TensorList(shards));
  if (!unsharded.empty() && unsharded[0].requires_grad()) group_.add_pending_node();
  for (size_t i = 0; i < group_.params().size(); ++i) group_.params()[i].set_substitutes(unsharded[i]);
}

// [Note: activation checkpointing re-enters forward] tdc::nn::checkpoint runs the module, hooks
// included, under no-grad in forward and again with grad during backward. The first run goes
// IDLE -> FORWARD -> IDLE and registers no backward hooks (no grad). The recompute runs inside
// the root's backward: pre_forward gathers again, post_forward reshards (unless the root) and
// hooks the recomputed outputs, whose gradients then take the module through PRE_BACKWARD ->
// POST_BACKWARD like any other call. So forward is legal from PRE_BACKWARD and POST_BACKWARD too (a
// module checkpointed twice is recomputed after its first backward). PyTorch's module-hook
// checkpoint recomputes after FSDP's pre-backward unshard and skips the forward hooks in
// PRE_BACKWARD; tdc's reentrant checkpoint needs them for the new autograd node, at the price of
// one more all-gather per checkpointed module. Forward is also accepted from Forward: a forward
// that threw never reached post_forward.
nn::Tensors FSDPState::pre_forward(nn::Tensors inputs) {
  lazy_init();
  training_state_ = TrainingState::FORWARD;
  const MixedPrecisionPolicy& mp = group_.mp_policy();
  if (mp.param_dtype && mp.cast_forward_inputs) inputs = cast_floating(std::move(inputs), *mp.param_dtype);
  group_.unshard();
  prefetch_unshard(forward_prefetch_);
  record_pre_forward_and_prefetch();
  if (!group_.empty()) apply_unshard_function();
  return inputs;
}

nn::Tensors FSDPState::post_forward(nn::Tensors outputs) {
  check_state(label_, "post-forward", training_state_, {TrainingState::FORWARD});
  if (group_.reshard_after_forward && !is_root()) group_.finish_and_reshard();
  record_post_forward();
  if (is_root() && group_.mp_policy().output_dtype) {
    outputs = cast_floating(std::move(outputs), *group_.mp_policy().output_dtype);
  }
  if (at::GradMode::is_enabled()) {
    std::weak_ptr<FSDPState> weak = weak_from_this();
    for (auto& y : outputs) {
      if (!y.defined() || !y.requires_grad()) continue;
      y.register_hook([weak](const at::Tensor& g) {
        if (auto s = weak.lock()) s->pre_backward();
        return g;
      });
    }
  }
  training_state_ = TrainingState::IDLE;
  return outputs;
}

// Runs once per output gradient (one hook per output), so PRE_BACKWARD -> PRE_BACKWARD is normal.
void FSDPState::pre_backward() {
  check_state(label_, "pre-backward", training_state_,
              {TrainingState::IDLE, TrainingState::PRE_BACKWARD, TrainingState::POST_BACKWARD});
  if (is_root()) queue_root_post_backward();
  const bool entering = training_state_ != TrainingState::PRE_BACKWARD;
  training_state_ = TrainingState::PRE_BACKWARD;
  if (group_.empty()) return;
  group_.check_unmodified("backward");
  group_.unshard();
  prefetch_unshard(backward_prefetch_);
  if (entering) implicit_backward_prefetch();
}

std::vector<at::Tensor> FSDPState::post_backward(const std::vector<at::Tensor>& grads) {
  check_state(label_, "post-backward", training_state_,
              {TrainingState::IDLE, TrainingState::PRE_BACKWARD, TrainingState::POST_BACKWARD});
  check_state(label_, "post-backward (its backward computed with the unsharded parameters)", group_.sharded_state(),
              {ShardedState::UNSHARDED});
  training_state_ = TrainingState::POST_BACKWARD;
  auto root = root_.lock();
  if (root) {
    if (auto previous = root->pending_reduce_.lock()) previous->group_.finish_reduce();
    root->pending_reduce_ = weak_from_this();
    root->queue_root_post_backward();
  }
  group_.reduce_grads_async(grads);
  if (!root) group_.finish_reduce();
  if (group_.finish_pending_node() && group_.reshard_after_backward) group_.finish_and_reshard();
  return std::vector<at::Tensor>(grads.size());  // [Note: async reduce-scatter]
}

// [Note: async reduce-scatter] A group's gradients are reduce-scattered while the backward of the
// modules before it computes, as PyTorch's FSDP2 does on its reduce-scatter stream: post_backward
// issues the collective (async work on the backend's threads) and returns no gradients to
// autograd; the shard gradients are added to the shards' .grad (as autograd's AccumulateGrad
// would: the first one taken, later ones added) when the collective is finished, which is at the
// next group's post_backward (at most one reduce-scatter in flight, as in PyTorch) or at the
// end of backward (root_post_backward), so every .grad is complete when backward() returns.
// Every rank finishes and issues them in the same order. The values are the same as a blocking
// reduce-scatter's: the same collective on the same buffers, then the same division.
void FSDPState::queue_root_post_backward() {
  if (root_backward_queued_) return;
  root_backward_queued_ = true;
  std::weak_ptr<FSDPState> weak = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    if (auto s = weak.lock()) s->root_post_backward();
  });
}

void FSDPState::root_post_backward() {
  root_backward_queued_ = false;
  post_forward_order_.clear();
  pending_reduce_.reset();
  for (auto& w : tree_) {
    auto s = w.lock();
    if (!s) continue;
    s->group_.finish_reduce();
    s->post_forward_indices_.clear();
    s->training_state_ = TrainingState::IDLE;
    s->group_.clear_pending_nodes();  // nodes of unused outputs never run
    // [Note: a mistargeted prefetch ends with backward] A prefetch whose module did not run left
    // its all-gather pending. Finished here (PyTorch's finalize_backward waits for it too), the
    // group is UNSHARDED with the versions it gathered, so after the optimizer changes the shards
    // the next unshard sees them stale and gathers again. Left pending, the next unshard would only
    // wait for it and compute with the shards of before the step.
    s->group_.wait_for_unshard();
    if (s->group_.reshard_after_backward) s->group_.finish_and_reshard();
  }
}

// The autograd engine's graph task of the calling thread: -1 outside backward.
bool FSDPState::backward_in_flight() { return torch::autograd::get_current_graph_task_id() != -1; }

void FSDPState::check_user_control(const char* action) const {
  if (training_state_ == TrainingState::FORWARD) {
    throw_lifecycle_error(label_, action, "FORWARD (inside its own forward)", "IDLE");
  }
  if (backward_in_flight()) {
    throw_lifecycle_error(label_, action, fmt::format("{} during a backward pass", to_string(training_state_)),
                          "IDLE outside forward and backward (FSDP's hooks own the parameters there; "
                          "prefetch with set_modules_to_backward_prefetch)");
  }
}

ShardedCounts sharded_counts(const nn::Module& root) {
  ShardedCounts counts;
  for (auto& s : states_in(root)) {
    const int n = static_cast<int>(s->group().params().size());
    counts.params += n;
    if (s->group().sharded_state() == ShardedState::UNSHARDED) counts.unsharded += n;
    if (s->group().sharded_state() == ShardedState::UNSHARDING) counts.unsharding += n;
  }
  return counts;
}

}  // namespace tdc::fsdp
