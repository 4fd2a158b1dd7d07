// Conformance: PyTorch's test/distributed/_composable/fsdp/test_fully_shard_extensions.py. Same
// class and method names, same assertions.
//
// How the Python tensor subclasses map to C++:
//  * TwoTensor is tdc::conformance::two_tensor (conformance/support/two_tensor.h): a real
//    two-part wrapper tensor whose every op runs on both parts ([Note: TwoTensor's dispatch]).
//    FSDP2 shards it (the sharded parameter is a TwoTensor), all-gathers its parts through the
//    hooks, trains it; its gradient reduces as in PyTorch (plain, from the parts' copy-in);
//  * the all-gather extension is registered per parameter (fsdp::set_all_gather_extension)
//    instead of living as methods on the subclass or as attributes of an instance;
//  * BFloat16AllGatherTensor is re-created as an extension with the same pre/post hooks on a
//    plain parameter (its wrapper only forwards every op to its data).
// Launchers: the MultiProcess class runs fork-launched ranks (ws 2); the MultiThread class runs
// its 8 ranks as threads (the harness's thread launcher), as FSDPTestMultiThread does.
#include <functional>
#include <mutex>
#include <unordered_map>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "tdc/comm/collectives.h"
#include "tdc/conformance/checks.h"
#include "tdc/conformance/support.h"
#include "tdc/conformance/two_tensor.h"
#include "tdc/device_mesh.h"
#include "tdc/fixtures/models.h"
#include "tdc/fsdp/all_gather_extension.h"
#include "tdc/fsdp/fully_shard.h"
#include "tdc/harness/harness.h"
#include "tdc/harness/subtests.h"
#include "tdc/nn/layers.h"
#include "tdc/nn/to_empty.h"
#include "tdc/tensor/module_params.h"

namespace {

using namespace tdc;
using conformance::assert_equal;  // self.assertEqual
using harness::Axis;
using harness::ctx;
// Copy without a version bump (the original's `out` path does this under no_grad on a
// non-leaf; autograd saved aliases of `dst`).
void copy_quietly(const at::Tensor& dst, const at::Tensor& src) {
  at::AutoDispatchBelowADInplaceOrView guard;
  at::NoGradGuard no_grad;
  dst.copy_(src);
}

// ------------------------------------------------------------------ TwoTensor's all-gather hooks

// What the hooks saw, per rank (thread-local: the MultiThread class runs ranks as threads).
struct HookCounts {
  int post_calls_without_out = 0, post_calls_with_out = 0, aliased_checks = 0, cast_copies = 0;
};
thread_local HookCounts hooks;

// fsdp_pre_all_gather (v1 and v2): the local shard's inner tensors (a, b), metadata None.
fsdp::PreAllGatherResult two_tensor_pre(const at::Tensor& local) {
  conformance::TwoParts p = conformance::two_parts(local, "fsdp_pre_all_gather");
  return {{p.a, p.b}, nullptr};
}

fsdp::AllGatherExtension two_tensor_extension(int version) {
  fsdp::AllGatherExtension ext;
  if (version == 1) {
    ext.pre_all_gather_v1 = [](const at::Tensor& local, const DeviceMesh&) { return two_tensor_pre(local); };
  } else {
    ext.pre_all_gather = [](const at::Tensor& local, const DeviceMesh&, const std::vector<int64_t>&,
                            const std::vector<int64_t>&, nn::Module&,
                            const fsdp::MixedPrecisionPolicy&) { return two_tensor_pre(local); };
  }
  // fsdp_post_all_gather: with `out`, FSDP gathered into out's own buffers when the dtype is the
  // parameter's (checked by data pointer, as the original), else out.a / out.b are refilled by
  // copy; without, TwoTensor(a, b) cast to param_dtype, and (a, b) for FSDP to free.
  ext.post_all_gather = [](const std::vector<at::Tensor>& outputs, const std::shared_ptr<void>& metadata,
                           at::ScalarType param_dtype, at::Tensor* out) -> fsdp::PostAllGatherResult {
    if (outputs.size() != 2) throw std::runtime_error("fsdp_post_all_gather: expected (a, b)");
    if (metadata) throw std::runtime_error("fsdp_post_all_gather: metadata must be None");
    const at::Tensor& a = outputs[0];
    const at::Tensor& b = outputs[1];
    if (out) {
      ++hooks.post_calls_with_out;
      conformance::TwoParts o = conformance::two_parts(*out, "fsdp_post_all_gather(out)");
      if (a.scalar_type() == param_dtype) {
        if (a.storage().data_ptr().get() != o.a.storage().data_ptr().get() ||
            b.storage().data_ptr().get() != o.b.storage().data_ptr().get()) {
          throw std::runtime_error("fsdp_post_all_gather: the outputs do not alias out.a / out.b");
        }
        ++hooks.aliased_checks;
      } else {
        if (o.a.scalar_type() != param_dtype || o.b.scalar_type() != param_dtype) {
          throw std::runtime_error(fmt::format("fsdp_post_all_gather(out): out.a is {} and out.b is {}, param_dtype {}",
                                               c10::toString(o.a.scalar_type()), c10::toString(o.b.scalar_type()),
                                               c10::toString(param_dtype)));
        }
        ++hooks.cast_copies;
        copy_quietly(o.a, a);
        copy_quietly(o.b, b);
      }
      return {};
    }
    ++hooks.post_calls_without_out;
    return {conformance::two_tensor(a, b).to(param_dtype), {a, b}};
  };
  return ext;
}

// _init_two_tensor_mlp(): Sequential of 3 x MLP(8, bias=False); every in_proj/out_proj weight
// replaced by a parameter wrapping TwoTensor(w, w.clone()).
std::shared_ptr<nn::Sequential> init_two_tensor_mlp() {
  std::vector<nn::ModulePtr> mlps;
  for (int i = 0; i < 3; ++i) mlps.push_back(std::make_shared<fixtures::MLP>(8, /*bias=*/false));
  auto model = std::make_shared<nn::Sequential>(mlps);
  for (auto& [fqn, w] : model->named_params()) {
    auto [owner, name] = model->owner_of(fqn);
    owner->replace_param(name,
                         conformance::two_tensor(w.detach(), w.detach().clone()).requires_grad_(w.requires_grad()));
  }
  return model;
}
std::vector<std::string> weight_fqns(nn::Module& model) {
  std::vector<std::string> out;
  for (auto& [fqn, p] : model.named_params()) {
    if (fqn.find("weight") != std::string::npos) out.push_back(fqn);
  }
  return out;
}
// _patch_two_tensor_fsdp_all_gather(version): the hooks on every TwoTensor parameter (C++ has no
// class attributes to set; the extension is registered per parameter).
void patch_two_tensor_fsdp_all_gather(nn::Module& model, int version) {
  for (const auto& fqn : weight_fqns(model)) {
    if (!conformance::is_two_tensor(tensor::param_dtensor(model, fqn)->to_local())) {
      throw std::runtime_error(fqn + ": the sharded parameter is not a TwoTensor");
    }
    fsdp::set_all_gather_extension(model, fqn, two_tensor_extension(version));
  }
}

void fully_shard_stack(nn::Module& model, const fsdp::FullyShardOptions& opts) {
  for (auto& [name, mlp] : model.named_children_tdc()) fsdp::fully_shard(*mlp, opts);
  fsdp::fully_shard(model, opts);
}

// trunc_normal_ (mean 0, std 1, cut at +-2) of every parameter.
void trunc_normal_init(nn::Module& model) {
  at::NoGradGuard no_grad;
  for (auto& p : model.params()) {
    p.normal_();
    p.clamp_(-2.0, 2.0);
  }
}

// ------------------------------------------------------------------ TestFullyShardAllGatherExtensionsMultiProcess

// _test_all_gather_extensions_train_parity under _patch_two_tensor_fsdp_all_gather(version).
void _test_all_gather_extensions_train_parity(int version, bool reshard_after_forward) {
  hooks = HookCounts{};
  at::manual_seed(42);
  auto model = init_two_tensor_mlp();
  conformance::sync_from_rank0(*model);
  nn::ModulePtr ref_model = model->deep_copy();
  torch::optim::Adam ref_optim(ref_model->params(), torch::optim::AdamOptions(1e-2));
  fully_shard_stack(*model, {.reshard_after_forward = reshard_after_forward});
  patch_two_tensor_fsdp_all_gather(*model, version);
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(1e-2));
  EXPECT_TRUE(conformance::sharded_parity(*ref_model, *model)) << "v" + std::to_string(version) + " after fully_shard:";

  auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + ctx().rank + 1);
  at::Tensor inp = at::randn({2, 8}, gen);
  for (int iter_idx = 0; iter_idx < 10; ++iter_idx) {
    const std::string when = "v" + std::to_string(version) + " iteration " + std::to_string(iter_idx);
    at::Tensor ref_loss = (*ref_model)(inp).sum();
    ref_loss.backward();
    for (auto& p : ref_model->params()) {
      comm::all_reduce(p.mutable_grad(), comm::ReduceOp::SUM);
      p.mutable_grad().div_(ctx().world_size);
    }
    at::Tensor loss = (*model)(inp).sum();
    loss.backward();
    ASSERT_TRUE(assert_equal(loss, ref_loss)) << when + " loss";
    EXPECT_TRUE(conformance::sharded_parity(*ref_model, *model)) << when + ":";
    for (auto* optim_ : {&ref_optim, &optim}) {
      optim_->step();
      optim_->zero_grad(/*set_to_none=*/iter_idx % 2 == 0);
    }
    EXPECT_TRUE(conformance::sharded_parity(*ref_model, *model)) << when + " after step:";
  }
  EXPECT_GT(hooks.post_calls_without_out, 0);
  if (reshard_after_forward) {
    EXPECT_GT(hooks.post_calls_with_out, 0) << "re-gathers refill the first unsharded tensors";
    EXPECT_EQ(hooks.aliased_checks, hooks.post_calls_with_out);
  }
}

TDC_DIST_TEST(TestFullyShardAllGatherExtensionsMultiProcess, test_all_gather_extensions_train_parity, .world_size = 2,
              .timeout_s = 120) {
  TDC_REQUIRE_CAPABILITY("fsdp2.all_gather_extensions");
  conformance::world();
  for (int version : {1, 2}) {
    harness::subtests(Axis<bool>("reshard_after_forward", {true, false}),
                      std::bind_front(_test_all_gather_extensions_train_parity, version));
  }
}

// ------------------------------------------------------------------ TestFullyShardAllGatherExtensionsMultiThread (8 threads)

constexpr harness::Launcher kThreads = harness::Launcher::Thread;

// _test_all_gather_extensions_end_to_end: meta-device model, fully_shard with bf16 parameters,
// to_empty, init; three training steps through the extension's out= path with a dtype-changing
// post hook.
void _test_all_gather_extensions_end_to_end(int version, bool reshard_after_forward) {
  hooks = HookCounts{};
  auto model = init_two_tensor_mlp();
  nn::to_empty(*model, at::kMeta);  // "under the meta device": LibTorch has no meta-device context
  for (auto& p : model->params()) ASSERT_TRUE(p.is_meta());
  fully_shard_stack(*model,
                    {.reshard_after_forward = reshard_after_forward, .mp_policy = {.param_dtype = at::kBFloat16}});
  nn::to_empty(*model, at::kCPU);
  trunc_normal_init(*model);
  patch_two_tensor_fsdp_all_gather(*model, version);
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(1e-2));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + ctx().rank + 1);
  at::Tensor inp = at::randn({2, 8}, gen);
  for (int i = 0; i < 3; ++i) {
    (*model)(inp).sum().backward();
    optim.step();
    optim.zero_grad();
  }
  // tdc's addition: b was drawn apart from a and is still its own tensor after three steps (the
  // sharded parameter is a real TwoTensor, both parts trained).
  for (const auto& fqn : weight_fqns(*model)) {
    conformance::TwoParts p = conformance::two_parts(tensor::param_dtensor(*model, fqn)->to_local(), "end_to_end");
    if (p.a.numel() > 0) {
      EXPECT_TRUE(conformance::assert_not_equal(p.a, p.b)) << fqn;
    }
  }
  EXPECT_GT(hooks.post_calls_without_out, 0);
  if (reshard_after_forward) {
    EXPECT_GT(hooks.post_calls_with_out, 0);
    // The gathered fp32 (a, b) are cast into bf16 `out`s: the branch whose dtype asserts ran.
    EXPECT_EQ(hooks.cast_copies, hooks.post_calls_with_out);
  }
}

TDC_DIST_TEST(TestFullyShardAllGatherExtensionsMultiThread, test_all_gather_extensions_end_to_end, .world_size = 8,
              .timeout_s = 120, .launcher = kThreads) {
  TDC_REQUIRE_CAPABILITY("fsdp2.all_gather_extensions");
  conformance::world();
  for (int version : {1, 2}) {
    harness::subtests(Axis<bool>("reshard_after_forward", {true, false}),
                      std::bind_front(_test_all_gather_extensions_end_to_end, version));
  }
}

thread_local bool tls_pre_all_gather_called = false;

// Hooks bound per parameter after materialisation (the original binds them as attributes of the
// local shard objects): bf16 cast in pre, upcast in post.
TDC_DIST_TEST(TestFullyShardAllGatherExtensionsMultiThread, test_all_gather_extensions_monkey_patch, .world_size = 8,
              .timeout_s = 120, .launcher = kThreads) {
  TDC_REQUIRE_CAPABILITY("fsdp2.all_gather_extensions");
  conformance::world();
  tls_pre_all_gather_called = false;
  auto model = init_two_tensor_mlp();
  nn::to_empty(*model, at::kMeta);
  fully_shard_stack(*model, {});
  nn::to_empty(*model, at::kCPU);
  trunc_normal_init(*model);

  fsdp::AllGatherExtension ext;
  ext.pre_all_gather = [](const at::Tensor& local, const DeviceMesh&, const std::vector<int64_t>&,
                          const std::vector<int64_t>&, nn::Module&, const fsdp::MixedPrecisionPolicy&) {
    tls_pre_all_gather_called = true;
    return fsdp::PreAllGatherResult{{local.to(at::kBFloat16)}, nullptr};
  };
  ext.post_all_gather = [](const std::vector<at::Tensor>& outputs, const std::shared_ptr<void>& metadata,
                           at::ScalarType param_dtype, at::Tensor* out) -> fsdp::PostAllGatherResult {
    at::NoGradGuard no_grad;
    if (outputs.size() != 1 || outputs[0].scalar_type() != at::kBFloat16) {
      throw std::runtime_error("post_all_gather: expected one bf16 output");
    }
    if (metadata) throw std::runtime_error("post_all_gather: metadata must be None");
    if (out) {
      copy_quietly(*out, outputs[0]);
      return {};
    }
    at::Tensor upcast = outputs[0].to(param_dtype);
    return {upcast, {outputs[0], upcast}};
  };
  int patched = 0;
  for (auto& [fqn, p] : model->named_params()) {
    if (fqn.find("weight") == std::string::npos) continue;
    fsdp::set_all_gather_extension(*model, fqn, ext);
    ++patched;
  }
  ASSERT_GT(patched, 0);
  torch::optim::Adam optim(model->params(), torch::optim::AdamOptions(1e-2));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + ctx().rank + 1);
  at::Tensor inp = at::randn({2, 8}, gen);
  for (int i = 0; i < 3; ++i) {
    (*model)(inp).sum().backward();
    optim.step();
    optim.zero_grad();
  }
  EXPECT_TRUE(tls_pre_all_gather_called);
}

// BFloat16AllGatherTensor's hooks: pre pads an uneven shard itself, using outer_size.
fsdp::AllGatherExtension bf16_all_gather_extension(bool pad_in_pre_all_gather = true) {
  fsdp::AllGatherExtension ext;
  ext.pre_all_gather = [pad_in_pre_all_gather](const at::Tensor& local, const DeviceMesh& mesh,
                                               const std::vector<int64_t>& outer_size, const std::vector<int64_t>&,
                                               nn::Module&, const fsdp::MixedPrecisionPolicy&) {
    if (mesh.ndim() != 1) throw std::runtime_error("BFloat16AllGatherTensor: expects a 1-D mesh");
    const int64_t n = mesh.size();
    if (outer_size[0] % n != 0 && pad_in_pre_all_gather) {
      std::vector<int64_t> padded = outer_size;
      padded[0] = (outer_size[0] + n - 1) / n;
      at::Tensor buf = at::empty(padded, local.options().dtype(at::kBFloat16));
      if (local.size(0) > 0) buf.narrow(0, 0, local.size(0)).copy_(local);
      return fsdp::PreAllGatherResult{{buf}, nullptr};
    }
    return fsdp::PreAllGatherResult{{local.to(at::kBFloat16)}, nullptr};
  };
  ext.post_all_gather = [](const std::vector<at::Tensor>& outputs, const std::shared_ptr<void>&,
                           at::ScalarType param_dtype, at::Tensor* out) -> fsdp::PostAllGatherResult {
    if (outputs.size() != 1 || outputs[0].scalar_type() != at::kBFloat16) {
      throw std::runtime_error("BFloat16AllGatherTensor: expected one bf16 output");
    }
    if (out) {
      copy_quietly(*out, outputs[0].narrow(0, 0, out->size(0)));
      return {};
    }
    at::Tensor upcast = outputs[0].to(param_dtype);
    return {upcast, {outputs[0], upcast}};
  };
  return ext;
}

TDC_DIST_TEST(TestFullyShardAllGatherExtensionsMultiThread, test_all_gather_extension_outer_size_stride,
              .world_size = 8, .timeout_s = 120, .launcher = kThreads) {
  TDC_REQUIRE_CAPABILITY("fsdp2.all_gather_extensions");
  conformance::world();
  ASSERT_GE(ctx().world_size, 2);
  auto model = std::make_shared<fixtures::MLP>(3, /*bias=*/true, /*with_buffer=*/false, /*dim_multiplier=*/3);
  fsdp::fully_shard(*model, {.reshard_after_forward = false});  // True is upstream issue 154836
  for (auto& [fqn, p] : model->named_params()) {
    if (fqn.find("weight") != std::string::npos)
      fsdp::set_all_gather_extension(*model, fqn, bf16_all_gather_extension());
  }
  // The uneven layouts the test is about (8 ranks): in_proj (9, 3) -> shards of 2, 2, 2, 2, 1, 0,
  // 0, 0 rows padded to 2; out_proj (3, 9) -> 1 row on ranks 0-2, none on 3-7, padded to 1.
  EXPECT_EQ(tensor::param_dtensor(*model, "in_proj.weight")->to_local().size(0),
            std::max<int64_t>(0, std::min<int64_t>(2, 9 - 2 * ctx().rank)));
  EXPECT_EQ(tensor::param_dtensor(*model, "out_proj.weight")->to_local().size(0), ctx().rank < 3 ? 1 : 0);
  torch::optim::AdamW optim(model->params(), torch::optim::AdamWOptions(1e-2));  // fused: a GPU path (E.3)
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + ctx().rank + 1);
  at::Tensor inp = at::randn({2, 3}, gen);
  (*model)(inp).sum().backward();
  optim.step();
}

thread_local std::optional<DeviceMesh> tls_mesh;

TDC_DIST_TEST(TestFullyShardAllGatherExtensionsMultiThread, test_all_gather_extension_hsdp_mesh, .world_size = 8,
              .timeout_s = 120, .launcher = kThreads) {
  TDC_REQUIRE_CAPABILITY("fsdp2.all_gather_extensions");
  conformance::world();
  const int64_t replicate_size = 2;
  DeviceMesh mesh =
      init_device_mesh("cpu", {replicate_size, ctx().world_size / replicate_size}, {"dp_replicate", "dp_shard"});
  auto model = init_two_tensor_mlp();
  fully_shard_stack(*model, {.mesh = mesh});
  tls_mesh.reset();
  fsdp::AllGatherExtension ext;
  ext.pre_all_gather = [](const at::Tensor& local, const DeviceMesh& m, const std::vector<int64_t>&,
                          const std::vector<int64_t>&, nn::Module&, const fsdp::MixedPrecisionPolicy&) {
    tls_mesh = m;
    return fsdp::PreAllGatherResult{{local}, nullptr};
  };
  ext.post_all_gather = [](const std::vector<at::Tensor>& outputs, const std::shared_ptr<void>&, at::ScalarType,
                           at::Tensor* out) -> fsdp::PostAllGatherResult {
    if (out) return {};
    return {outputs[0], {outputs[0]}};
  };
  for (auto& [fqn, p] : model->named_params()) {
    if (fqn.find("weight") != std::string::npos) fsdp::set_all_gather_extension(*model, fqn, ext);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42 + ctx().rank + 1);
  (*model)(at::randn({2, 8}, gen));
  ASSERT_TRUE(tls_mesh.has_value());
  EXPECT_EQ(tls_mesh->ndim(), 1);
  EXPECT_EQ(tls_mesh->size(), ctx().world_size / replicate_size);
}

}  // namespace
