// Differentiable collectives: the Megatron-style conjugate pairs, each an autograd Function whose
// forward and backward are tdc collectives counted as c10d_functional.* (never as c10d.*).
#include "tdc/comm/functional.h"

#include <stdexcept>

#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>

#include "checks.h"
#include "internal.h"

namespace tdc::comm::functional {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group rides in the autograd context as an opaque capsule: backward may run after the
// caller's default group changed, and must use the group the forward used.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(GroupPtr g) : group(std::move(g)) {}
  GroupPtr group;
};
void save_group(AutogradContext* ctx, const GroupPtr& g) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(g));
}
GroupPtr load_group(AutogradContext* ctx) {
  auto capsule = ctx->saved_data["group"].toCapsule();
  return static_cast<GroupCapsule*>(capsule.get())->group;
}

int64_t wrap_dim(int64_t dim, const at::Tensor& t, const char* op) {
  const int64_t nd = std::max<int64_t>(t.dim(), 1);
  if (dim < -nd || dim >= nd) {
    throw std::invalid_argument(
        fmt::format("{}: dim {} is out of range for a tensor {}", op, dim, detail::describe(t)));
  }
  return dim < 0 ? dim + nd : dim;
}

// The collectives work along dim 0; other dims are moved to the front (and back) so the result
// is exactly torch.cat / torch.chunk along `dim`.
at::Tensor gather_along(const at::Tensor& x, int64_t dim, const GroupPtr& g) {
  at::Tensor front = x.detach().movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] *= g->size();
  at::Tensor out = at::empty(shape, front.options());
  detail::all_gather_into_tensor(out, front, g, false, OpKind::FunctionalAllGather);
  return out.movedim(0, dim).contiguous();
}

at::Tensor scatter_along(const at::Tensor& x, ReduceOp op, int64_t dim, const GroupPtr& g) {
  if (x.size(dim) % g->size() != 0) {
    throw std::invalid_argument(
        fmt::format("reduce_scatter_tensor on {}: dim {} of input {} has size {}, not divisible by the group "
                    "size {}",
                    detail::group_label(*g), dim, detail::describe(x), x.size(dim), g->size()));
  }
  at::Tensor front = x.detach().movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] /= g->size();
  at::Tensor out = at::empty(shape, front.options());
  detail::reduce_scatter_tensor(out, front, op, g, false, OpKind::FunctionalReduceScatter);
  return out.movedim(0, dim).contiguous();
}

at::Tensor reduce_all(const at::Tensor& x, ReduceOp op, const GroupPtr& g) {
  at::Tensor out = x.detach().clone(at::MemoryFormat::Contiguous);
  detail::all_reduce(out, op, g, false, OpKind::FunctionalAllReduce);
  return out;
}

// Gradients of the reductions: SUM passes the (summed) gradient through, AVG scales it by 1/n.
// MAX/MIN would need to know which rank won each element; not differentiable here.
void require_linear(ReduceOp op, const char* fn) {
  if (op != ReduceOp::SUM && op != ReduceOp::AVG) {
    throw std::runtime_error(fmt::format(
        "{}: backward through ReduceOp {} is not supported (only SUM and AVG are linear)", fn, to_string(op)));
  }
}

// forward: all-gather along dim; backward: reduce-scatter (SUM) along dim.
struct AllGather : torch::autograd::Function<AllGather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, int64_t dim, GroupPtr g) {
    ctx->saved_data["dim"] = dim;
    save_group(ctx, g);
    return gather_along(input, dim, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {scatter_along(grads[0], ReduceOp::SUM, ctx->saved_data["dim"].toInt(), load_group(ctx)), at::Tensor(),
            at::Tensor()};
  }
};

// forward: reduce-scatter along dim; backward: all-gather along dim (scaled by 1/n for AVG).
struct ReduceScatter : torch::autograd::Function<ReduceScatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ReduceOp op, int64_t dim, GroupPtr g) {
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["op"] = static_cast<int64_t>(op);
    save_group(ctx, g);
    return scatter_along(input, op, dim, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto op = static_cast<ReduceOp>(ctx->saved_data["op"].toInt());
    require_linear(op, "functional::reduce_scatter_tensor");
    GroupPtr g = load_group(ctx);
    at::Tensor grad = gather_along(grads[0], ctx->saved_data["dim"].toInt(), g);
    if (op == ReduceOp::AVG) grad.div_(g->size());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// forward: all-reduce; backward: all-reduce of the gradient (SUM for SUM, AVG for AVG: each
// input element reaches every rank's output with weight 1, resp. 1/n).
struct AllReduce : torch::autograd::Function<AllReduce> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, ReduceOp op, GroupPtr g) {
    ctx->saved_data["op"] = static_cast<int64_t>(op);
    save_group(ctx, g);
    return reduce_all(input, op, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto op = static_cast<ReduceOp>(ctx->saved_data["op"].toInt());
    require_linear(op, "functional::all_reduce");
    return {reduce_all(grads[0], op, load_group(ctx)), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor all_gather_tensor(const at::Tensor& input, int64_t gather_dim, const GroupPtr& group) {
  GroupPtr g = resolve(group);
  if (input.dim() == 0) {
    throw std::invalid_argument("all_gather_tensor: input is a 0-d tensor; gather needs a dim");
  }
  return AllGather::apply(input, wrap_dim(gather_dim, input, "all_gather_tensor"), g);
}

at::Tensor reduce_scatter_tensor(const at::Tensor& input, ReduceOp op, int64_t scatter_dim, const GroupPtr& group) {
  GroupPtr g = resolve(group);
  if (input.dim() == 0) {
    throw std::invalid_argument("reduce_scatter_tensor: input is a 0-d tensor; scatter needs a dim");
  }
  return ReduceScatter::apply(input, op, wrap_dim(scatter_dim, input, "reduce_scatter_tensor"), g);
}

at::Tensor all_reduce(const at::Tensor& input, ReduceOp op, const GroupPtr& group) {
  return AllReduce::apply(input, op, resolve(group));
}

}  // namespace tdc::comm::functional
