// Storage tricks FSDP1 and FSDP2 share (libtdc's base, no component): an unsharded tensor keeps its identity (autograd saved
// views of it) while its memory is freed and re-allocated.
#pragma once

#include <ATen/core/Tensor.h>

namespace tdc::core {

// Storage of a tensor freed / re-allocated in place (every alias sees the change); a wrapper
// tensor's parts each ([Note: wrapper tensors], tdc/core/wrapper_tensor.h).
void free_storage(const at::Tensor& t);
void alloc_storage(const at::Tensor& t);
// Whether any storage of `t` (a wrapper: of its parts) holds memory.
bool has_storage_allocated(const at::Tensor& t);
// Writes `src` into `dst` without bumping dst's version counter (autograd saved aliases of it).
void copy_quietly(const at::Tensor& dst, const at::Tensor& src);

}  // namespace tdc::core
