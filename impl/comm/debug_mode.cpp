#include "tdc/comm/debug_mode.h"

namespace tdc::comm {
namespace {
// Innermost live mode on this thread; each mode links to the one it nests in.
thread_local CommDebugMode* tls_current = nullptr;
}  // namespace

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce:
      return "c10d.allreduce_";
    case OpKind::AllGatherBase:
      return "c10d._allgather_base_";
    case OpKind::ReduceScatterBase:
      return "c10d._reduce_scatter_base_";
    case OpKind::AllToAllBase:
      return "c10d.alltoall_base_";
    case OpKind::Broadcast:
      return "c10d.broadcast_";
    case OpKind::Send:
      return "c10d.send";
    case OpKind::Recv:
      return "c10d.recv_";
    case OpKind::Barrier:
      return "c10d.barrier";
    case OpKind::FunctionalAllReduce:
      return "c10d_functional.all_reduce";
    case OpKind::FunctionalAllGather:
      return "c10d_functional.all_gather_into_tensor";
    case OpKind::FunctionalReduceScatter:
      return "c10d_functional.reduce_scatter_tensor";
    case OpKind::FunctionalAllToAll:
      return "c10d_functional.all_to_all_single";
  }
  return "unknown";
}

CommDebugMode::CommDebugMode() : previous_(tls_current) { tls_current = this; }

// Modes are scoped objects, so they end in reverse order of creation on their thread.
CommDebugMode::~CommDebugMode() { tls_current = previous_; }

std::map<std::string, int64_t> CommDebugMode::get_comm_counts() const { return counts_; }
std::map<std::string, int64_t> CommDebugMode::get_comm_bytes() const { return bytes_; }

int64_t CommDebugMode::get_total_counts() const {
  int64_t total = 0;
  for (const auto& [name, n] : counts_) total += n;
  return total;
}

void CommDebugMode::record(OpKind kind, int64_t bytes) {
  const char* name = op_name(kind);
  for (CommDebugMode* m = tls_current; m != nullptr; m = m->previous_) {
    m->counts_[name] += 1;
    m->bytes_[name] += bytes;
  }
}

}  // namespace tdc::comm
