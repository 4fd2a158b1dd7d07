// CommDebugMode: counts the collectives issued on the calling thread (rank) while it is alive,
// per op kind, with bytes. Op names follow PyTorch's op overloads so that conformance tests can
// assert the same keys: "c10d_functional.all_reduce", "c10d._allgather_base_",
// "c10d._reduce_scatter_base_", "c10d.allreduce_", ...
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tdc::comm {

enum class OpKind {
  AllReduce,                // c10d.allreduce_
  AllGatherBase,            // c10d._allgather_base_
  ReduceScatterBase,        // c10d._reduce_scatter_base_
  AllToAllBase,             // c10d.alltoall_base_
  Broadcast,                // c10d.broadcast_
  Send,                     // c10d.send
  Recv,                     // c10d.recv_
  Barrier,                  // c10d.barrier
  FunctionalAllReduce,      // c10d_functional.all_reduce
  FunctionalAllGather,      // c10d_functional.all_gather_into_tensor
  FunctionalReduceScatter,  // c10d_functional.reduce_scatter_tensor
  FunctionalAllToAll,       // c10d_functional.all_to_all_single
};
const char* op_name(OpKind k);

class CommDebugMode {
 public:
  CommDebugMode();  // starts counting on this thread (nests: inner and outer both count)
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  std::map<std::string, int64_t> get_comm_counts() const;  // op name -> count
  std::map<std::string, int64_t> get_comm_bytes() const;   // op name -> bytes sent by this rank
  int64_t get_total_counts() const;

  // Called by tdc::comm for every collective issued (users do not call it).
  static void record(OpKind kind, int64_t bytes);

 private:
  std::map<std::string, int64_t> counts_;
  std::map<std::string, int64_t> bytes_;
  CommDebugMode* previous_;
};

}  // namespace tdc::comm
