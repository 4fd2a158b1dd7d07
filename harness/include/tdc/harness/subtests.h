// Named subtests over a parameter grid, inside one world (amortises launch and rendezvous).
//
//   tdc::harness::subtests({{"reshard", {true, false}}, {"size", {1, 3}}},
//                          [&](const tdc::harness::Params& p) {
//                            bool reshard = p.get<bool>("reshard");
//                            ...
//                          });
//
// Combinations run in Cartesian order, last key fastest (PyTorch's run_subtests). Every failure
// inside names its parameters: "[rank 1] [subtest reshard=True, size=3] ...". After each
// combination all ranks meet in a store barrier. A failing subtest does not stop the others.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace tdc::harness {

using ParamValue = std::variant<bool, int64_t, double, std::string>;
std::string to_string(const ParamValue& v);

class Params {
 public:
  std::vector<std::pair<std::string, ParamValue>> items;

  template <class T>
  T get(const std::string& name) const {
    const ParamValue& v = value(name);
    if constexpr (std::is_same_v<T, int> || std::is_same_v<T, int64_t>) {
      return static_cast<T>(std::get<int64_t>(v));
    } else {
      return std::get<T>(v);
    }
  }
  const ParamValue& value(const std::string& name) const;  // throws naming the missing key
  std::string str() const;                                // "reshard=True, size=3"
};

using Grid = std::vector<std::pair<std::string, std::vector<ParamValue>>>;

void subtests(const Grid& grid, const std::function<void(const Params&)>& fn);

// Every combination of the grid, in run order.
std::vector<Params> expand_grid(const Grid& grid);

}  // namespace tdc::harness
