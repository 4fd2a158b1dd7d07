#include "tdc/harness/subtests.h"

#include <stdexcept>

#include "internal.h"

namespace tdc::harness {

std::string to_string(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) return x ? "True" : "False";  // PyTorch's spelling
        else if constexpr (std::is_same_v<T, std::string>) return x;
        else return fmt::format("{}", x);
      },
      v);
}

const ParamValue& Params::value(const std::string& name) const {
  for (auto& [k, v] : items)
    if (k == name) return v;
  std::vector<std::string> keys;
  for (auto& kv : items) keys.push_back(kv.first);
  throw std::out_of_range(fmt::format("subtest parameter '{}' does not exist (parameters: {})", name,
                                      fmt::join(keys, ", ")));
}

std::string Params::str() const {
  std::vector<std::string> parts;
  for (auto& [k, v] : items) parts.push_back(k + "=" + to_string(v));
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::vector<Params> expand_grid(const Grid& grid) {
  std::vector<Params> out(1);
  for (auto& [name, values] : grid) {
    if (values.empty())
      throw std::invalid_argument(fmt::format("subtest parameter '{}' has no values", name));
    std::vector<Params> next;
    for (auto& partial : out)
      for (auto& v : values) {  // the last key varies fastest, as itertools.product does
        Params p = partial;
        p.items.emplace_back(name, v);
        next.push_back(std::move(p));
      }
    out = std::move(next);
  }
  return out;
}

void subtests(const Grid& grid, const std::function<void(const Params&)>& fn) {
  auto& label = detail::subtest_label();
  for (const Params& p : expand_grid(grid)) {
    label = p.str();
    try {
      fn(p);
    } catch (const detail::PeerLeft&) {
      label.clear();
      throw;  // a peer failed or skipped and left: this rank's body ends too
    } catch (const c10::Error& e) {
      ADD_FAILURE() << "uncaught exception: " << e.what_without_backtrace();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "uncaught exception: " << e.what();
    }
    label.clear();
    if (in_rank()) barrier();  // like run_subtests: every rank finishes a combination together
  }
}

}  // namespace tdc::harness
