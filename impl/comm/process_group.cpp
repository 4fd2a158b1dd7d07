#include "tdc/comm/process_group.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "tdc/comm/backend_registry.h"
#include "tdc/libtorch_compat.h"

namespace tdc::comm {
namespace {

// [Note: construction barrier] Creating a Gloo group is a collective: each rank connects to every
// other. A rank that finishes first and destroys its group (end of a test) while a peer is still
// connecting makes that peer fail with "Connection closed by peer". So every group creation ends
// with a store barrier: nobody returns until every rank is past construction.
void construction_barrier(const c10::intrusive_ptr<c10d::Store>& store, int size) {
  const std::string arrived = "tdc/constructed";
  const std::string done = "tdc/constructed/done";
  if (store->add(arrived, 1) == size) store->set(done, std::vector<uint8_t>{1});
  store->wait({done});
}

// Per-thread state of the default group: thread-launched ranks each have their own world.
struct WorldState {
  GroupPtr world;
  uint64_t generation = 0;                 // init_process_group calls so far (store prefixes)
  std::map<std::string, int> group_count;  // new_group calls per member set (store prefixes)
  int next_group_id = 0;                   // default names "group<k>"
};
thread_local WorldState tls;

}  // namespace

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend, int rank,
                           int size, GroupOptions options, std::vector<int> global_ranks)
    : store_(std::move(store)),
      backend_(std::move(backend)),
      rank_(rank),
      size_(size),
      options_(std::move(options)),
      global_ranks_(std::move(global_ranks)) {
  const BackendOps ops = BackendRegistry::instance().ops_of(options_.backend);  // [Note: native ops or emulation]
  native_avg_ = ops.avg;
  native_reduce_scatter_ = ops.reduce_scatter;
  alltoall_reduce_scatter_ = ops.reduce_scatter_by_alltoall;
  p2p_all_gather_ = ops.all_gather_by_p2p;
  alltoall_gathers_ = ops.gather_by_alltoall;
}

bool ProcessGroup::all_reduce_by_alltoall(ReduceOp op, const at::Tensor& t) const {
  const at::ScalarType dt = t.scalar_type();
  const bool summable = at::isFloatingType(dt) || at::isIntegralType(dt, /*includeBool=*/false);
  return alltoall_gathers_ && size_ >= 2 && (op == ReduceOp::SUM || op == ReduceOp::AVG) && summable && t.numel() > 0 &&
         static_cast<int64_t>(t.nbytes()) < kSmallInputBytes;
}

int ProcessGroup::next_collective_tag() {
  return static_cast<int>(kCollectiveTagBase | (collective_tags_++ & (kCollectiveTagBase - 1)));
}

std::shared_ptr<ProcessGroup> ProcessGroup::create(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                   const GroupOptions& options, std::vector<int> global_ranks) {
  if (!store) throw std::invalid_argument("ProcessGroup::create: store is null");
  if (size < 1 || rank < 0 || rank >= size) {
    throw std::invalid_argument(
        fmt::format("ProcessGroup::create (group '{}'): rank {} is not in [0, {})", options.name, rank, size));
  }
  if (global_ranks.empty()) {
    global_ranks.resize(size);
    std::iota(global_ranks.begin(), global_ranks.end(), 0);
  }
  if (static_cast<int>(global_ranks.size()) != size) {
    throw std::invalid_argument(
        fmt::format("ProcessGroup::create (group '{}'): {} global ranks given for a group of size {}", options.name,
                    global_ranks.size(), size));
  }
  auto backend = BackendRegistry::instance().create(options.backend, store, rank, size, options);
  construction_barrier(store, size);
  return std::make_shared<ProcessGroup>(store, std::move(backend), rank, size, options, std::move(global_ranks));
}

GroupPtr init_process_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                            const GroupOptions& options) {
  if (tls.world) {
    throw std::logic_error(
        fmt::format("init_process_group: rank {} already has a default group (world size {}); call "
                    "destroy_process_group first",
                    tls.world->rank(), tls.world->size()));
  }
  GroupOptions opts = options;
  if (opts.name.empty()) opts.name = "world";
  // Each world gets its own key space on the shared store, so a later world on the same store
  // (destroy, then init again) never reads the keys of an earlier one.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(fmt::format("tdc/world{}", tls.generation++), store);
  auto world = ProcessGroup::create(prefixed, rank, world_size, opts);
  tls.world = world;
  tls.group_count.clear();
  tls.next_group_id = 0;
  return world;
}

bool is_initialized() { return tls.world != nullptr; }

GroupPtr default_group() {
  if (!tls.world) {
    throw std::logic_error(
        "no default process group on this thread: call tdc::comm::init_process_group (tests: "
        "tdc::conformance::world()) first, on every rank's own thread");
  }
  return tls.world;
}

void destroy_process_group() {
  tls.world.reset();
  tls.group_count.clear();
}

GroupPtr new_group(const std::vector<int>& ranks, const GroupOptions& options) {
  GroupPtr world = default_group();
  if (ranks.empty()) throw std::invalid_argument("new_group: the list of ranks is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= world->size()) {
      throw std::invalid_argument(
          fmt::format("new_group: rank {} is not in the world [0, {}) (ranks {})", sorted[i], world->size(), ranks));
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw std::invalid_argument(fmt::format("new_group: rank {} appears twice in ranks {}", sorted[i], ranks));
    }
  }
  auto me = std::find(sorted.begin(), sorted.end(), world->rank());
  if (me == sorted.end()) return nullptr;

  GroupOptions opts = options;
  const GroupOptions defaults;
  if (opts.backend == defaults.backend && opts.device_type == defaults.device_type &&
      opts.timeout == defaults.timeout) {
    opts.backend = world->backend_name();
    opts.device_type = world->device_type();
    opts.timeout = world->options().timeout;
  }
  const int id = tls.next_group_id++;
  if (opts.name.empty()) opts.name = fmt::format("group{}", id);

  // [Note: sub-group store prefix] Deterministic without talking to anyone: the member set plus
  // how many groups over that exact set this rank made before. Members create their groups in
  // the same order, so they agree; non-members never see the key space.
  const std::string members = fmt::format("{}", fmt::join(sorted, ","));
  const int nth = tls.group_count[members]++;
  auto store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("tdc/group/{}/{}", members, nth), world->store());
  return ProcessGroup::create(store, static_cast<int>(me - sorted.begin()), static_cast<int>(sorted.size()), opts,
                              sorted);
}

const GroupPtr& resolve(const GroupPtr& group) {
  if (group) return group;
  if (!tls.world) default_group();  // throws the explanatory message
  return tls.world;
}

}  // namespace tdc::comm
