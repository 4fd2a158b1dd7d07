// The built-in "gloo" backend. This is the only TU that includes ProcessGroupGloo.hpp: it needs
// USE_C10D_GLOO and gloo's own headers and costs ~10 s to compile (docs/decisions.md, "Build").
//
// [Note: Gloo is created inside LibTorch]
// LibTorch links its own pinned copy of gloo and ships none of its headers; the gloo headers this
// TU is compiled with come from elsewhere (Debian's libgloo-dev) and may declare other classes
// than the gloo inside LibTorch. So this TU only *declares* gloo things and never runs code from
// those headers: it calls two functions compiled inside LibTorch (Options::create_default, which
// picks the device as torch.distributed does: GLOO_SOCKET_IFNAME, else the hostname's address,
// else loopback; and ProcessGroupGloo's constructor) and touches no gloo type itself. Nothing of
// gloo may be instantiated here: an inline gloo function or template emitted into libtdc would be
// exported and could interpose on LibTorch's own copy, with another class layout (the SIGSEGV in
// ProcessGroupGloo::enqueue seen against 2.11, docs/compat.md). CTest tdc_gloo_isolation_test
// fails the build's tests if libtdc.so defines any symbol that mentions gloo.
#include <algorithm>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include <sched.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "internal.h"

namespace tdc::comm::detail {

namespace {

using GlooOptions = c10d::ProcessGroupGloo::Options;

// [Note: Gloo's threads run as batch work]
// A Gloo device's TCP loop (gloo/transport/tcp/loop.cc, pair.cc) handles a connection's events
// only if it gets the connection's lock with try_lock; when another thread holds it, the loop
// returns to epoll_wait, which reports the same level-triggered event at once: it spins until the
// holder lets go. The holder is a c10d worker thread in the middle of a send, and on a busy
// machine it is often not running: the write that wakes the peer's loop thread is where the
// scheduler preempts it (wakeup preemption), while the loop it keeps out burns a CPU that it
// needs. In the seed suite (six tests side by side on 2 CPUs) those spins were most of the
// suite's system time: millions of epoll_wait calls that returned one event and read nothing
// (docs/bench/suite_time.md, "Gloo's threads as batch work"). SCHED_BATCH (sched(7)) is the
// normal policy at the same nice value without wakeup preemption: a thread Gloo wakes waits for
// the running one's turn to end instead of preempting it. So the device's loop thread and each
// group's worker threads start as SCHED_BATCH: they are created on a short-lived thread that
// switched itself to it, and inherit it (pthread_create's default). The caller's own thread is
// not touched, and nothing changes when the caller does not run SCHED_OTHER (a real-time caller
// keeps its policy for Gloo's threads too) or the system refuses the switch. Results do not
// depend on it: only who runs first.
template <class Make>
auto on_batch_thread(Make make) -> decltype(make()) {
  decltype(make()) made;
  std::exception_ptr error;
  std::thread maker([&] {
    if (sched_getscheduler(0) == SCHED_OTHER) {
      sched_param param{};
      (void)sched_setscheduler(0, SCHED_BATCH, &param);  // best effort: only scheduling changes
    }
    try {
      made = make();
    } catch (...) {
      error = std::current_exception();
    }
  });
  maker.join();
  if (error) std::rethrow_exception(error);
  return made;
}

// [Note: one Gloo device per process]
// A Gloo device is a listening socket and the thread that runs its TCP event loop; LibTorch's
// Options::create_default makes a new one on every call, and torch.distributed calls it for
// every group, so a rank with a world group, a DeviceMesh's subgroups and a test's own groups ran
// dozens of loop threads, each waking every 10 ms when idle. Here the groups of a process with
// the same timeout share one Options, so one device and one loop thread serve all their
// connections, as a device is built to (it holds any number of pairs; each group keeps its own
// contexts, pairs and worker threads, so groups stay independent). The seed suite ran 3-4 %
// faster so, side by side (docs/bench/suite_time.md). Options are shared only between groups
// this TU creates, and nothing changes them (tdc never calls setTimeout on a backend). The cache
// belongs to one process: a forked child that finds its parent's entries (whose loop threads do
// not exist in it) abandons them without destroying them (a destructor would join a thread that
// is not there) and creates its own. The cache itself is never destroyed: its devices live until
// the process ends, after every group that uses them.
struct SharedOptions {
  std::mutex mu;
  pid_t pid = 0;
  std::map<int64_t, c10::intrusive_ptr<GlooOptions>> by_timeout_ms;
};

c10::intrusive_ptr<GlooOptions> options_for(std::chrono::milliseconds timeout) {
  static auto* shared = new SharedOptions();
  std::lock_guard<std::mutex> lock(shared->mu);
  if (shared->pid != ::getpid()) {
    for (auto& [ms, options] : shared->by_timeout_ms) options.release();  // the parent's: never destroyed here
    shared->by_timeout_ms.clear();
    shared->pid = ::getpid();
  }
  auto& options = shared->by_timeout_ms[timeout.count()];
  if (!options) {
    options = on_batch_thread([&] { return GlooOptions::create_default(timeout); });
    // LibTorch gives two worker threads per device; async ops in flight at once need at least two.
    options->threads = std::max(options->threads, 2);
  }
  return options;
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    const GroupOptions& options) {
  auto gloo_options = options_for(options.timeout);
  return on_batch_thread([&]() -> c10::intrusive_ptr<c10d::Backend> {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
  });
}

}  // namespace tdc::comm::detail
