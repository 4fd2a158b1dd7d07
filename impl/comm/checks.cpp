// [Note: cross-rank argument checks] A collective whose ranks disagree on the tensor shape, the
// dtype, the op or the root does not fail in Gloo: it hangs, or returns garbage. So before each
// collective (unless TDC_COMM_CHECKS=0 or set_argument_checks(false)) every rank contributes a
// fixed-size int64 fingerprint to one all-gather on the same group, and every rank compares all
// of them. All ranks see the same data, so they all throw, with the same message: nobody is left
// waiting in the real collective. A rank whose own arguments are bad (wrong output size) raises
// a flag in its fingerprint instead of throwing at once, for the same reason. These exchanges are
// not counted by CommDebugMode (they are tdc's, not the caller's).
#include "checks.h"

#include "internal.h"

#include "tdc/comm/argument_checks.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tdc::comm::detail {
namespace {

thread_local std::optional<bool> tls_checks;
thread_local ArgumentCheckCounts tls_counts;

constexpr int64_t kMagic = 0x7dc0c4ec;
constexpr int kMaxDims = 8;
// Layout of the fixed part of a fingerprint.
enum Field : int {
  kFMagic,
  kFOp,
  kFDtype,
  kFNdim,
  kFShape,
  kFReduce = kFShape + kMaxDims,
  kFRoot,
  kFBadArgs,
  kFRide,
  kFRideBytes,
  kFixed
};

std::string dtype_name(int64_t code) {
  switch (static_cast<at::ScalarType>(code)) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(static_cast<at::ScalarType>(code));
  }
}

std::string describe_fp(const int64_t* f) {
  if (f[kFDtype] < 0) return "no tensor";
  std::vector<std::string> dims;
  const int64_t nd = f[kFNdim];
  for (int64_t d = 0; d < std::min<int64_t>(nd, kMaxDims); ++d) {
    dims.push_back(f[kFShape + d] < 0 ? std::string("*") : std::to_string(f[kFShape + d]));
  }
  if (nd > kMaxDims) dims.back() = fmt::format("{} (product of dims {}..{})", dims.back(), kMaxDims - 1, nd - 1);
  return fmt::format("{}[{}]", dtype_name(f[kFDtype]), fmt::join(dims, ", "));
}

std::string reduce_name(int64_t code) { return code < 0 ? "none" : to_string(static_cast<ReduceOp>(code)); }

}  // namespace

bool checks_enabled() {
  if (!tls_checks) {
    const char* env = std::getenv("TDC_COMM_CHECKS");
    tls_checks = !(env != nullptr && std::string(env) == "0");
  }
  return *tls_checks;
}

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::AllReduce:
      return "all_reduce";
    case Coll::AllGather:
      return "all_gather_into_tensor";
    case Coll::ReduceScatter:
      return "reduce_scatter_tensor";
    case Coll::AllToAll:
      return "all_to_all_single";
    case Coll::Broadcast:
      return "broadcast";
    case Coll::Barrier:
      return "barrier";
  }
  return "collective";
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{}[{}]", dtype_name(static_cast<int64_t>(t.scalar_type())), fmt::join(t.sizes(), ", "));
}

std::string group_label(const ProcessGroup& g) { return fmt::format("group '{}' (size {})", g.name(), g.size()); }

namespace {

// This rank's fingerprint of `a` on g: kFixed words, then the 2 n split sizes of all_to_all_single
// (n inputs, n outputs), so every rank can verify every pair, not only its own.
std::vector<int64_t> fingerprint(const ProcessGroup& g, const CheckArgs& a) {
  const int n = g.size();
  std::vector<int64_t> fp(kFixed + 2 * n, -1);
  fp[kFMagic] = kMagic;
  fp[kFOp] = static_cast<int64_t>(a.op);
  fp[kFReduce] = a.reduce ? static_cast<int64_t>(*a.reduce) : -1;
  fp[kFRoot] = a.root;
  fp[kFBadArgs] = a.local_error.empty() ? 0 : 1;
  fp[kFRide] = 0;
  fp[kFRideBytes] = 0;
  if (a.tensor.defined()) {
    fp[kFDtype] = static_cast<int64_t>(a.tensor.scalar_type());
    fp[kFNdim] = a.tensor.dim();
    for (int64_t d = 0; d < a.tensor.dim(); ++d) {
      const int64_t slot = std::min<int64_t>(d, kMaxDims - 1);
      fp[kFShape + slot] = d <= kMaxDims - 1 ? a.tensor.size(d) : fp[kFShape + slot] * a.tensor.size(d);
    }
    if (a.ignore_dim0 && a.tensor.dim() > 0) fp[kFShape] = -1;
  }
  for (size_t i = 0; i < a.splits.size() && i < static_cast<size_t>(2 * n); ++i) fp[kFixed + i] = a.splits[i];
  return fp;
}

// Throws, on every rank alike, when the fingerprints (`at_rank(r)` is rank r's) disagree.
void compare(const ProcessGroup& g, const CheckArgs& a, const std::function<const int64_t*(int)>& at_rank) {
  const int n = g.size();
  const std::string where = fmt::format("{} on {}", coll_name(a.op), group_label(g));
  if (!a.local_error.empty()) throw std::invalid_argument(a.local_error);
  std::vector<int> bad;
  for (int r = 0; r < n; ++r) {
    if (at_rank(r)[kFMagic] != kMagic) {
      throw std::runtime_error(
          fmt::format("{}: rank {} is in a different kind of collective (no tdc "
                      "fingerprint; calls out of order?)",
                      where, r));
    }
    if (at_rank(r)[kFBadArgs] != 0) bad.push_back(r);
  }
  if (!bad.empty()) {
    throw std::runtime_error(
        fmt::format("{}: rank(s) {} rejected their arguments (see their errors)", where, fmt::join(bad, ", ")));
  }
  // Compare every rank with rank 0, one field group at a time, most basic first.
  auto disagree = [&](const char* what, auto same, auto show) {
    std::vector<std::string> parts;
    for (int r = 1; r < n; ++r) {
      if (!same(at_rank(0), at_rank(r))) parts.push_back(fmt::format("rank {} {}", r, show(at_rank(r))));
    }
    if (parts.empty()) return;
    throw std::runtime_error(
        fmt::format("{}: ranks disagree on {}: rank 0 {}, {}", where, what, show(at_rank(0)), fmt::join(parts, ", ")));
  };
  disagree(
      "the collective", [](const int64_t* x, const int64_t* y) { return x[kFOp] == y[kFOp]; },
      [](const int64_t* x) { return std::string(coll_name(static_cast<Coll>(x[kFOp]))); });
  disagree(
      "the tensor",
      [](const int64_t* x, const int64_t* y) { return std::equal(x + kFDtype, x + kFShape + kMaxDims, y + kFDtype); },
      describe_fp);
  disagree(
      "the reduce op", [](const int64_t* x, const int64_t* y) { return x[kFReduce] == y[kFReduce]; },
      [](const int64_t* x) { return reduce_name(x[kFReduce]); });
  disagree(
      "the source rank", [](const int64_t* x, const int64_t* y) { return x[kFRoot] == y[kFRoot]; },
      [](const int64_t* x) { return std::to_string(x[kFRoot]); });
  if (a.op == Coll::AllToAll) {
    for (int s = 0; s < n; ++s) {
      for (int d = 0; d < n; ++d) {
        const int64_t sends = at_rank(s)[kFixed + d];        // s's input split for d
        const int64_t expects = at_rank(d)[kFixed + n + s];  // d's output split from s
        if (sends != expects) {
          throw std::runtime_error(
              fmt::format("{}: split sizes disagree: rank {} sends {} rows to rank {}, which expects {}", where, s,
                          sends, d, expects));
        }
      }
    }
  }
}

constexpr int64_t kRideWords = kRideBytes / static_cast<int64_t>(sizeof(int64_t));

// [Note: a small collective rides with its check] Each check is one exchange, and so is a small
// collective's data: on a group of CPU tensors the check's exchange carries the data too, so a
// small collective is one exchange instead of two. Every check on such a group sends each other
// rank a frame of a fixed size, the same whatever the tensors are: the fingerprint, then up to
// kRideBytes of the collective's data for that rank. The size must not depend on the arguments,
// since the arguments are what may disagree: a frame sized by them would hang the exchange the
// check exists to make safe. A rank whose data fits (and whose collective offers it) says so in
// its fingerprint; when every rank's data rode and the fingerprints agree, every rank has all it
// needs and the collective ends with its local part (the same copies and sums as its all-to-all
// form, so the same bits). Otherwise every rank, having seen every flag, runs the collective as
// usual. Groups of other devices (NCCL) exchange the fingerprint alone, as before.
bool frames_possible(const ProcessGroup& g, int64_t frame_bytes) {
  return g.device_type() == "cpu" && g.all_gather_by_alltoall(frame_bytes);
}

// This rank's payload for each other rank when all fit: contiguous CPU tensors of equal size.
std::optional<std::vector<at::Tensor>> payloads(const ProcessGroup& g, const CheckArgs& a, const Ride* ride) {
  if (ride == nullptr || !ride->payload || !a.local_error.empty()) return std::nullopt;
  std::vector<at::Tensor> out(g.size());
  int64_t bytes = -1;
  for (int d = 0; d < g.size(); ++d) {
    if (d == g.rank()) continue;
    at::Tensor p = ride->payload(d);
    const int64_t b = p.defined() ? static_cast<int64_t>(p.nbytes()) : 0;
    if (p.defined() && (!p.is_cpu() || !p.is_contiguous())) return std::nullopt;
    if (b > kRideBytes || (bytes >= 0 && b != bytes)) return std::nullopt;
    bytes = b;
    out[d] = std::move(p);
  }
  return out;
}

void write_frame(int64_t* frame, const std::vector<int64_t>& fp, const at::Tensor& payload) {
  std::copy(fp.begin(), fp.end(), frame);
  if (payload.defined() && payload.nbytes() > 0) std::memcpy(frame + fp.size(), payload.data_ptr(), payload.nbytes());
}

// The check's exchange in frames ([Note: a small collective rides with its check]).
std::optional<Ridden> exchange_frames(const ProcessGroup& g, const CheckArgs& a, std::vector<int64_t> fp,
                                      const Ride* ride) {
  const int n = g.size(), me = g.rank();
  const int64_t len = static_cast<int64_t>(fp.size()), words = len + kRideWords;
  auto mine = payloads(g, a, ride);
  if (mine) {
    fp[kFRide] = 1;
    for (const auto& p : *mine) {
      if (p.defined()) fp[kFRideBytes] = static_cast<int64_t>(p.nbytes());
    }
  }
  const auto opts = at::TensorOptions().dtype(at::kLong);
  c10d::AllToAllOptions ao;
  ao.timeout = g.options().timeout;
  // Two ranks send nothing to themselves ([Note: a two-rank gather sends its input as it is]).
  const int first = n == 2 ? 1 - me : 0;
  const int frames = n == 2 ? 1 : n;
  at::Tensor send = at::zeros({frames * words}, opts), recv = at::empty({frames * words}, opts);
  for (int d = 0; d < n; ++d) {
    if (n == 2 && d == me) continue;
    write_frame(send.data_ptr<int64_t>() + (d - first) * words, fp, mine && d != me ? (*mine)[d] : at::Tensor());
  }
  std::vector<int64_t> out_splits;
  if (n == 2) {
    out_splits.assign(2, 0);
    out_splits[first] = words;
  }
  std::vector<int64_t> in_splits = out_splits;  // Gloo moves from both: two vectors
  g.backend().alltoall_base(recv, send, out_splits, in_splits, ao)->wait();
  ++tls_counts.checks;
  const int64_t* got = recv.data_ptr<int64_t>();
  compare(g, a, [&](int r) { return r == me && n == 2 ? fp.data() : got + (r - first) * words; });
  for (int r = 0; r < n; ++r) {
    const int64_t* f = r == me && n == 2 ? fp.data() : got + (r - first) * words;
    if (f[kFRide] != 1) return std::nullopt;
  }
  ++tls_counts.rides;
  return Ridden(recv, words, len, first);
}

// The check's exchange of the fingerprints alone (groups of other devices).
void exchange_fingerprints(const ProcessGroup& g, const CheckArgs& a, const std::vector<int64_t>& fp) {
  const int n = g.size();
  const int64_t len = static_cast<int64_t>(fp.size());
  at::Device device = a.tensor.defined() ? a.tensor.device() : at::Device(g.device_type());
  at::Tensor mine = at::tensor(fp, at::TensorOptions().dtype(at::kLong)).to(device);
  at::Tensor all = at::empty({n * len}, mine.options());
  if (g.all_gather_by_alltoall(static_cast<int64_t>(mine.nbytes()))) {
    start_gather_by_alltoall(g, all, mine)->wait();  // [Note: gathers by all-to-all]
  } else {
    g.backend()._allgather_base(all, mine)->wait();
  }
  ++tls_counts.checks;
  all = all.cpu().contiguous();
  const int64_t* f = all.data_ptr<int64_t>();
  compare(g, a, [&](int r) { return f + r * len; });
}

std::optional<Ridden> check(const ProcessGroup& g, const CheckArgs& a, const Ride* ride) {
  if (!checks_enabled()) {
    if (!a.local_error.empty()) throw std::invalid_argument(a.local_error);
    return std::nullopt;
  }
  std::vector<int64_t> fp = fingerprint(g, a);
  const int64_t frame_bytes = static_cast<int64_t>(fp.size() * sizeof(int64_t)) + kRideBytes;
  if (frames_possible(g, frame_bytes)) return exchange_frames(g, a, std::move(fp), ride);
  exchange_fingerprints(g, a, fp);
  return std::nullopt;
}

}  // namespace

const uint8_t* Ridden::from(int src) const {
  const int64_t frame = src - first_rank_;
  TORCH_CHECK(frame >= 0 && frame * frame_words_ < frames_.numel(), "tdc::comm: no frame from rank ", src);
  return reinterpret_cast<const uint8_t*>(frames_.data_ptr<int64_t>() + frame * frame_words_ + payload_word_);
}

void Ridden::copy_from(int src, const at::Tensor& dst) const {
  const uint8_t* payload = from(src);
  const int64_t sent = reinterpret_cast<const int64_t*>(payload)[kFRideBytes - payload_word_];
  TORCH_CHECK(dst.is_cpu() && dst.is_contiguous() && static_cast<int64_t>(dst.nbytes()) == sent, "tdc::comm: rank ",
              src, " sent ", sent, " bytes with its check, but the collective expects ", dst.nbytes(),
              " in a contiguous CPU tensor");
  if (sent > 0) std::memcpy(dst.data_ptr(), payload, dst.nbytes());
}

void agree(const ProcessGroup& g, const CheckArgs& a) { check(g, a, nullptr); }

std::optional<Ridden> agree(const ProcessGroup& g, const CheckArgs& a, const Ride& ride) { return check(g, a, &ride); }

}  // namespace tdc::comm::detail

namespace tdc::comm {
void set_argument_checks(bool enabled) { detail::tls_checks_set(enabled); }
bool argument_checks() { return detail::checks_enabled(); }
ArgumentCheckCounts argument_check_counts() { return detail::tls_counts; }
}  // namespace tdc::comm

namespace tdc::comm::detail {
void tls_checks_set(bool enabled) { tls_checks = enabled; }
}  // namespace tdc::comm::detail
