// torch.nn.init formulas shared by tdc's layers (internal). Each is a no-op for random inits
// while deep_copy_in_progress(), so copies consume no RNG.
#pragma once

#include <ATen/core/Tensor.h>

namespace tdc::nn::init {

void linear_weight_(const at::Tensor& w);                // kaiming_uniform_(a=sqrt(5))
void linear_bias_(const at::Tensor& b, int64_t fan_in);  // uniform_(±1/sqrt(fan_in))
void xavier_uniform_(const at::Tensor& w);               // gain 1
void constant_(const at::Tensor& t, double v);

}  // namespace tdc::nn::init
