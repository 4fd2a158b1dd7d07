// DTensor as a value class (architecture.md: C++ has no __torch_dispatch__): a local tensor plus
// its spec (mesh, placements, global shape and stride). Redistribution is differentiable: the
// local tensor carries autograd, and backward performs the conjugate transition. Gradient rule
// (docs/dtensor.md): the gradient of placements P is laid out as P with Partial -> Replicate;
// backward redistributes it from that layout of the output to that layout of the input
// (shard->replicate: all-gather forward, chunk backward; replicate->shard: chunk forward,
// all-gather backward; partial->replicate: all-reduce forward, identity backward; ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "tdc/device_mesh.h"
#include "tdc/tensor/placement.h"

namespace tdc::tensor {

struct DTensorSpec {
  // Null in a default-constructed spec (an undefined DTensor); every real spec has a mesh.
  DeviceMesh mesh;
  Placements placements;        // one per mesh dim
  std::vector<int64_t> shape;   // global
  std::vector<int64_t> stride;  // global, contiguous unless stated
  at::ScalarType dtype = at::kFloat;

  // The local shape and the offset in the global tensor of the calling rank's shard.
  std::vector<int64_t> local_shape() const;
  std::vector<int64_t> local_offset() const;
  std::string to_string() const;
};

class DTensor {
 public:
  DTensor() = default;
  DTensor(at::Tensor local, DTensorSpec spec);

  const at::Tensor& to_local() const { return local_; }  // autograd flows through it
  const DTensorSpec& spec() const { return spec_; }
  const DeviceMesh& device_mesh() const { return spec_.mesh; }
  const Placements& placements() const { return spec_.placements; }
  const std::vector<int64_t>& shape() const { return spec_.shape; }
  int64_t dim() const { return static_cast<int64_t>(spec_.shape.size()); }
  bool defined() const { return local_.defined(); }
  bool requires_grad() const { return local_.requires_grad(); }

  // Differentiable. Any placements to any placements, on every mesh dim at once.
  DTensor redistribute(const Placements& placements) const;
  // The whole global tensor on every rank (redistribute to all-Replicate, then the local tensor).
  at::Tensor full_tensor() const;

  // Gradient of the local tensor as a DTensor with this spec's placements, Partial replaced by
  // Replicate (the gradient rule above); nullopt when there is none.
  std::optional<DTensor> grad() const;

 private:
  at::Tensor local_;
  DTensorSpec spec_;
};

// Splits a tensor that every rank holds (identical) into the rank's shard; Partial placements
// are not allowed here (as in PyTorch). Differentiable w.r.t. `tensor`. `src_rank`'s copy is what
// counts (broadcast first when `broadcast_from_src` is true; by default it trusts the caller).
DTensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh, const Placements& placements,
                          bool broadcast_from_src = false, int src_rank = 0);

struct FromLocalOptions {
  // When set, the global shape and stride; else derived assuming even shards (as PyTorch).
  std::optional<std::vector<int64_t>> shape;
  std::optional<std::vector<int64_t>> stride;
  // All-gather the local shapes and check they are consistent with the placements (costs a
  // collective; an inconsistent shape is an error naming each rank's shape).
  bool run_check = false;
};
// Wraps the rank's local tensor. Differentiable.
DTensor from_local(const at::Tensor& local, const DeviceMesh& mesh, const Placements& placements,
                   const FromLocalOptions& options = {});

}  // namespace tdc::tensor
