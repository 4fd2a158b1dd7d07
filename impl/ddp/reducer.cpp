// The Reducer (reducer.h): construction-time checks and broadcast, buckets, gradient-ready hooks,
// overlapped bucket all-reduces, end-of-backward finalisation, unused-parameter search.
#include "reducer.h"

#include "tdc/comm/argument_checks.h"
#include "tdc/comm/gather_strings.h"
#include "tdc/tensor/detail/layout.h"

#include <map>
#include <set>
#include <stdexcept>
#include <unordered_set>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

namespace tdc::ddp {

namespace {

using torch::autograd::variable_list;

// [Note: bucket all-reduces skip the argument checks] tdc::comm's per-collective argument check is
// a blocking fingerprint all-gather. Bucket all-reduces run inside backward, where a blocking
// exchange per bucket would serialise the overlap DDP exists for. They are safe without it: the
// construction-time fingerprint proves every rank has the same parameters, so every rank builds
// the same buckets (same order, dtypes and sizes) and launches them in index order.

class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(std::weak_ptr<Reducer> reducer, size_t index) : reducer_(std::move(reducer)), index_(index) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    if (auto r = reducer_.lock()) r->mark_ready(index_);
    return outputs;
  }

 private:
  std::weak_ptr<Reducer> reducer_;
  size_t index_;
};

std::string shape_of(const at::Tensor& t) { return tensor::detail::shape_str(t.sizes().vec()); }

// One line per parameter / buffer: "<kind> <fqn> <dtype> <shape>".
struct Entry {
  std::string kind, name, dtype, shape;
  bool operator==(const Entry&) const = default;
  std::string describe() const { return fmt::format("{} '{}' {} {}", kind, name, dtype, shape); }
};

std::vector<Entry> parse_fingerprint(const std::string& text) {
  std::vector<Entry> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    Entry e;
    size_t a = line.find('\t'), b = line.find('\t', a + 1), c = line.find('\t', b + 1);
    e.kind = line.substr(0, a);
    e.name = line.substr(a + 1, b - a - 1);
    e.dtype = line.substr(b + 1, c - b - 1);
    e.shape = line.substr(c + 1);
    out.push_back(std::move(e));
  }
  return out;
}

// Broadcasts `tensors` from group rank 0, one flat buffer per dtype (PyTorch broadcasts
// coalesced too). Writes go to autograd-free aliases: no version bump on parameters that a
// previous forward may have saved.
void broadcast_coalesced(const std::vector<at::Tensor>& tensors, const comm::GroupPtr& group) {
  std::map<std::pair<at::ScalarType, std::string>, std::vector<at::Tensor>> by_kind;
  for (const auto& t : tensors)
    if (t.numel() > 0) by_kind[{t.scalar_type(), t.device().str()}].push_back(t.variable_data());
  at::NoGradGuard no_grad;
  for (auto& [key, ts] : by_kind) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : ts) flat_parts.push_back(t.reshape(-1));
    at::Tensor flat = at::cat(flat_parts);
    comm::broadcast(flat, 0, group);
    if (group->rank() == 0) continue;
    int64_t off = 0;
    for (auto& t : ts) {
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------ construction
Reducer::Reducer(nn::Module& module, comm::GroupPtr group, DDPOptions options, std::string who)
    : module_(module), group_(comm::resolve(group)), options_(options), who_(std::move(who)) {}

std::shared_ptr<Reducer> Reducer::create(nn::Module& module, comm::GroupPtr group, DDPOptions options,
                                         std::string who) {
  if (!(options.bucket_cap_mb > 0))
    throw std::invalid_argument(fmt::format("{}: bucket_cap_mb must be > 0, got {}", who, options.bucket_cap_mb));
  std::shared_ptr<Reducer> r(new Reducer(module, std::move(group), options, std::move(who)));
  r->check_and_broadcast();
  r->build_buckets();
  r->install_hooks();
  return r;
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

// Exchanges a fingerprint of every parameter and buffer (kind, FQN, dtype, shape) before the
// broadcast, so that ranks with different models all fail with the same message instead of
// broadcasting mismatched buffers (a hang or garbage).
void Reducer::check_and_broadcast() {
  std::string fp;
  std::vector<at::Tensor> all;
  for (const auto& [name, t] : module_.named_params()) {
    fp += fmt::format("parameter\t{}\t{}\t{}\n", name, c10::toString(t.scalar_type()), shape_of(t));
    all.push_back(t);
  }
  for (const auto& [name, t] : module_.named_bufs()) {
    fp += fmt::format("buffer\t{}\t{}\t{}\n", name, c10::toString(t.scalar_type()), shape_of(t));
    all.push_back(t);
  }
  if (!fp.empty()) fp.pop_back();

  const int n = group_->size();
  std::vector<std::vector<Entry>> per_rank;
  for (const auto& s : comm::all_gather_strings(fp, group_)) per_rank.push_back(parse_fingerprint(s));
  size_t longest = 0;
  for (const auto& e : per_rank) longest = std::max(longest, e.size());
  for (size_t i = 0; i < longest; ++i) {
    bool same = true;
    for (int r = 1; r < n; ++r) {
      bool has0 = i < per_rank[0].size(), hasr = i < per_rank[r].size();
      if (has0 != hasr || (has0 && !(per_rank[0][i] == per_rank[r][i]))) same = false;
    }
    if (same) continue;
    const Entry& ref = i < per_rank[0].size() ? per_rank[0][i] : per_rank[n - 1][i];
    std::vector<std::string> ranks;
    for (int r = 0; r < n; ++r) {
      if (i < per_rank[r].size())
        ranks.push_back(fmt::format("rank {}: {}", r, per_rank[r][i].describe()));
      else
        ranks.push_back(fmt::format("rank {}: none (it has {} parameters and buffers)", r, per_rank[r].size()));
    }
    throw std::invalid_argument(
        fmt::format("{}: the model differs across ranks in {} '{}' (entry #{} of the parameters and buffers): "
                    "{}. Every rank must construct the same model before wrapping it.",
                    who_, ref.kind, ref.name, i, fmt::join(ranks, "; ")));
  }

  comm::ScopedArgumentChecks checks_off(false);  // every rank's dtypes and shapes were just compared
  broadcast_coalesced(all, group_);
}

// Reverse registration order (gradients of the last layers are ready first), a new bucket when
// the next parameter would take the current one past its cap; one open bucket per dtype and
// device, as PyTorch's compute_bucket_assignment_by_size. The first bucket of each dtype is capped
// at min(1 MiB, bucket_cap_mb) (PyTorch's _DEFAULT_FIRST_BUCKET_BYTES): it launches early.
void Reducer::build_buckets() {
  for (const auto& [name, p] : module_.named_params()) {
    if (!p.requires_grad()) continue;
    params_.push_back(p);
    names_.push_back(name);
  }
  const double cap_bytes = options_.bucket_cap_mb * 1024.0 * 1024.0;
  const double first_cap_bytes = std::min(cap_bytes, 1024.0 * 1024.0);
  struct Open {
    Bucket bucket;
    size_t first_pos;  // position of its first var in reverse order: buckets sort by it
    double bytes = 0;
    double cap = 0;
  };
  std::map<std::pair<at::ScalarType, std::string>, Open> open;
  std::set<std::pair<at::ScalarType, std::string>> had_first;
  std::vector<Open> closed;
  for (size_t pos = 0; pos < params_.size(); ++pos) {
    size_t i = params_.size() - 1 - pos;
    const at::Tensor& p = params_[i];
    auto key = std::make_pair(p.scalar_type(), p.device().str());
    double bytes = static_cast<double>(p.numel() * p.element_size());
    auto it = open.find(key);
    if (it != open.end() && it->second.bytes + bytes > it->second.cap) {
      closed.push_back(std::move(it->second));
      open.erase(it);
      it = open.end();
    }
    if (it == open.end()) {
      double cap = had_first.insert(key).second ? first_cap_bytes : cap_bytes;
      it = open.emplace(key, Open{Bucket{}, pos, 0, cap}).first;
    }
    it->second.bucket.vars.push_back(i);
    it->second.bytes += bytes;
  }
  for (auto& [key, o] : open) closed.push_back(std::move(o));
  std::sort(closed.begin(), closed.end(), [](const Open& a, const Open& b) { return a.first_pos < b.first_pos; });

  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  for (auto& o : closed) {
    Bucket b = std::move(o.bucket);
    int64_t off = 0;
    for (size_t s = 0; s < b.vars.size(); ++s) {
      bucket_of_[b.vars[s]] = buckets_.size();
      slot_of_[b.vars[s]] = s;
      b.offsets.push_back(off);
      off += params_[b.vars[s]].numel();
    }
    const at::Tensor& p0 = params_[b.vars.front()];
    b.flat = at::zeros({off}, p0.options().requires_grad(false));
    buckets_.push_back(std::move(b));
  }
  ready_.assign(params_.size(), 0);
  stats_.buckets = static_cast<int>(buckets_.size());
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> self = weak_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc)
      throw std::logic_error(
          fmt::format("{}: parameter '{}' has no gradient accumulator (not a leaf?)", who_, names_[i]));
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<ReadyHook>(self, i)));
    accumulators_.push_back(std::move(acc));
  }
}

// ------------------------------------------------------------------------------ forward side
void Reducer::pre_forward() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.empty())
      throw std::runtime_error(
          fmt::format("{} (raised by the previous backward; this {} cannot "
                      "continue: the ranks' reductions are out of step)",
                      error_, who_));
    if (state_ != State::IDLE)
      throw std::logic_error(
          fmt::format("{}: forward called while a backward is still reducing "
                      "gradients",
                      who_));
  }
  if (options_.broadcast_buffers) broadcast_buffers();
}

void Reducer::broadcast_buffers() {
  std::vector<at::Tensor> bufs;
  for (const auto& [name, b] : module_.named_bufs()) bufs.push_back(b);
  if (!bufs.empty() && group_->size() > 1) broadcast_coalesced(bufs, group_);
}

// Parameters whose gradient accumulators the graph of `outputs` does not reach will get no
// gradient in the coming backward; with find_unused_parameters they are marked ready (zeros) at
// its start, as PyTorch's prepare_for_backward + first autograd hook do.
void Reducer::post_forward(const nn::Tensors& outputs) {
  std::lock_guard<std::mutex> lock(mu_);
  unused_.clear();
  if (!options_.find_unused_parameters || !sync_ || !at::GradMode::is_enabled()) return;
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    auto edge = torch::autograd::impl::gradient_edge(out);
    if (edge.function && seen.insert(edge.function.get()).second) stack.push_back(edge.function.get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& e : node->next_edges())
      if (e.function && seen.insert(e.function.get()).second) stack.push_back(e.function.get());
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!seen.count(accumulators_[i].get())) unused_.push_back(i);
}

void Reducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_ = sync;
}

// ------------------------------------------------------------------------------ backward side
void Reducer::mark_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_) return;  // no_sync: the gradient stays (accumulates) in .grad, local only
  if (state_ == State::IDLE) begin_backward();
  mark_ready_locked(index);
}

void Reducer::begin_backward() {
  state_ = State::IN_BACKWARD;
  std::fill(ready_.begin(), ready_.end(), 0);
  ready_count_ = 0;
  next_bucket_ = 0;
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.vars.size());
    b.launched = false;
  }
  stats_ = BackwardStats{};
  stats_.buckets = static_cast<int>(buckets_.size());
  std::weak_ptr<Reducer> self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto r = self.lock()) r->finalize_backward();
  });
  std::vector<size_t> unused = std::move(unused_);
  unused_.clear();
  locally_used_.clear();
  if (options_.find_unused_parameters) {
    locally_used_.assign(params_.size(), 1);
    for (size_t i : unused) locally_used_[i] = 0;
  }
  for (size_t i : unused) mark_ready_locked(i);
}

void Reducer::mark_ready_locked(size_t index) {
  if (ready_[index])
    throw std::runtime_error(
        fmt::format("{}: parameter '{}' was marked ready twice in one backward (its gradient arrived after "
                    "find_unused_parameters declared it unused, or it took part in two backward passes "
                    "through the same forward)",
                    who_, names_[index]));
  ready_[index] = 1;
  ++ready_count_;
  Bucket& b = buckets_[bucket_of_[index]];
  const at::Tensor& p = params_[index];
  at::Tensor slot = b.flat.narrow(0, b.offsets[slot_of_[index]], p.numel());
  {
    at::NoGradGuard no_grad;
    const at::Tensor& g = p.grad();
    if (g.defined())
      slot.copy_(g.reshape(-1));
    else
      slot.zero_();
  }
  if (--b.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    stats_.launches.emplace_back(static_cast<int>(next_bucket_), static_cast<int>(params_.size() - ready_count_));
    {
      comm::ScopedArgumentChecks checks_off(false);  // [Note: bucket all-reduces skip the argument checks]
      b.work = comm::all_reduce(b.flat, comm::ReduceOp::AVG, group_, /*async_op=*/true);
    }
    b.launched = true;
    ++next_bucket_;
  }
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::IN_BACKWARD) return;
  state_ = State::IDLE;
  for (auto& b : buckets_)
    if (b.launched) b.work.wait();
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing.push_back(fmt::format("'{}'", names_[i]));
  if (!missing.empty()) {
    error_ = fmt::format(
        "{}: {} parameter(s) received no gradient in this backward on rank {}: {}. The forward did "
        "not use them, so the buckets holding them were never reduced. If some parameters may go "
        "unused in a forward, construct with find_unused_parameters=true "
        "(DDPOptions{{.find_unused_parameters = true}}); otherwise make the loss depend on them",
        who_, missing.size(), group_->rank(), fmt::join(missing, ", "));
    throw std::runtime_error(error_);
  }
  at::NoGradGuard no_grad;
  // Parameters no rank used keep their .grad as it was (None stays None), as PyTorch's reducer.
  std::vector<char> globally_unused(params_.size(), 0);
  if (!locally_used_.empty()) {
    at::Tensor used = at::tensor(locally_used_, at::kInt);
    if (group_->size() > 1) {
      comm::ScopedArgumentChecks checks_off(false);  // same size on every rank: one flag per parameter
      comm::all_reduce(used, comm::ReduceOp::SUM, group_);
    }
    for (size_t i = 0; i < params_.size(); ++i) globally_unused[i] = used[i].item<int32_t>() == 0;
    locally_used_.clear();
  }
  for (auto& b : buckets_) {
    for (size_t s = 0; s < b.vars.size(); ++s) {
      if (globally_unused[b.vars[s]]) continue;
      at::Tensor& p = params_[b.vars[s]];
      at::Tensor avg = b.flat.narrow(0, b.offsets[s], p.numel()).view(p.sizes());
      at::Tensor& g = p.mutable_grad();
      if (g.defined())
        g.copy_(avg);
      else
        g = avg.clone();
    }
  }
  stats_.finished = true;
}

}  // namespace tdc::ddp
