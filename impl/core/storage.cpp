// Storage tricks (tdc/core/storage.h).
#include "tdc/core/storage.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "tdc/core/wrapper_tensor.h"

namespace tdc::core {

// A wrapper tensor's data lives in its parts ([Note: wrapper tensors]): each is freed and
// re-allocated like a plain tensor.
void free_storage(const at::Tensor& t) {
  for (const at::Tensor& part : core::parts_of(t)) {
    c10::StorageImpl* s = part.storage().unsafeGetStorageImpl();
    if (s->nbytes() == 0) continue;
    s->set_data_ptr_noswap(at::DataPtr(nullptr, part.device()));
    s->set_nbytes(0);
  }
}

void alloc_storage(const at::Tensor& t) {
  for (const at::Tensor& part : core::parts_of(t)) {
    c10::StorageImpl* s = part.storage().unsafeGetStorageImpl();
    const size_t need = static_cast<size_t>(part.numel()) * part.element_size();
    if (s->nbytes() >= need) continue;
    s->set_data_ptr_noswap(s->allocator()->allocate(need));
    s->set_nbytes(need);
  }
}

bool has_storage_allocated(const at::Tensor& t) {
  const auto parts = core::parts_of(t);
  return std::any_of(parts.begin(), parts.end(),
                     [](const at::Tensor& p) { return p.storage().unsafeGetStorageImpl()->nbytes() > 0; });
}

void copy_quietly(const at::Tensor& dst, const at::Tensor& src) {
  at::AutoDispatchBelowADInplaceOrView guard;
  at::NoGradGuard no_grad;
  dst.copy_(src);
}

}  // namespace tdc::core
