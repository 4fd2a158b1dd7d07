// Named subtests over a parameter grid, inside one world (amortises launch and rendezvous):
// PyTorch's run_subtests. The typed form passes each combination to a typed body, as
// run_subtests passes kwargs to a test method:
//
//   void _test_train_parity(bool reshard_after_forward, int64_t mlp_dim) { ... }
//   ...
//   tdc::harness::subtests(tdc::harness::Axis<bool>("reshard_after_forward", {false, true}),
//                          tdc::harness::Axis<int64_t>("mlp_dim", {3, 16}),
//                          _test_train_parity);   // or a lambda [&](bool reshard, int64_t mlp_dim)
//
// The body takes one parameter per axis, in axis order. The string-keyed form stays for grids
// built at run time:
//
//   tdc::harness::subtests({{"reshard", {true, false}}, {"size", {1, 3}}},
//                          [&](const tdc::harness::Params& p) { bool reshard = p.get<bool>("reshard"); });
//
// Both run the combinations in Cartesian order, last axis fastest (itertools.product). Every
// failure inside names its parameters: "[rank 1] [subtest reshard=True, size=3] ...". After each
// combination all ranks meet in a store barrier. A failing subtest does not stop the others.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace tdc::harness {

using ParamValue = std::variant<bool, int64_t, double, std::string>;
std::string to_string(const ParamValue& v);  // bool as PyTorch spells it: True / False

// ------------------------------------------------------------------ typed axes

// What an axis may hold: the types a subtest label can spell as ParamValue does.
template <class T>
concept SubtestValue =
    std::same_as<T, bool> || std::integral<T> || std::floating_point<T> || std::same_as<T, std::string>;

// One named parameter and its values, in run order: Axis<bool>("reshard_after_forward", {false, true}).
template <SubtestValue T>
struct Axis {
  using value_type = T;
  Axis(std::string name, std::initializer_list<T> values) : name(std::move(name)), values(values) {}
  Axis(std::string name, std::vector<T> values) : name(std::move(name)), values(std::move(values)) {}
  std::string name;
  std::vector<T> values;
};

namespace internal {

template <class T>
inline constexpr bool is_axis = false;
template <class T>
inline constexpr bool is_axis<Axis<T>> = true;

// subtests(axes..., body): every argument but the last is an Axis.
template <class... Args>
concept AxesThenBody = sizeof...(Args) >= 2 && (is_axis<std::remove_cvref_t<Args>> + ...) == sizeof...(Args) - 1 &&
                       !is_axis<std::remove_cvref_t<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>>>;

// How a value appears in a subtest label (the same spelling as the string-keyed form's).
template <SubtestValue T>
ParamValue to_param_value(const T& v) {
  if constexpr (std::same_as<T, bool> || std::same_as<T, std::string>)
    return v;
  else if constexpr (std::integral<T>)
    return static_cast<int64_t>(v);
  else
    return static_cast<double>(v);
}

// One axis as the engine sees it: its name and the label spelling of each value.
struct AxisLabels {
  std::string name;
  std::vector<std::string> values;
};

template <class T>
AxisLabels labels_of(const Axis<T>& axis) {
  AxisLabels out{axis.name, {}};
  for (const T& v : axis.values) out.values.push_back(to_string(to_param_value(v)));
  return out;
}

// The engine of both forms: checks that no axis is empty (std::invalid_argument naming it), then
// calls body(index of each axis's value) once per combination as one named subtest.
void run_subtests(const std::vector<AxisLabels>& axes, const std::function<void(const std::vector<size_t>&)>& body);

template <class Body, class... Ts, size_t... I>
void run_typed(const std::tuple<const Axis<Ts>&...>& axes, Body& body, std::index_sequence<I...>) {
  static_assert(std::is_invocable_v<Body&, const Ts&...>,
                "subtests(axes..., body): body must take one parameter per axis, in axis order, "
                "each of (or convertible from) that axis's value type");
  run_subtests({labels_of(std::get<I>(axes))...},
               [&](const std::vector<size_t>& index) { std::invoke(body, std::get<I>(axes).values[index[I]]...); });
}

template <class... Args, size_t... I>
void split_axes_and_body(std::tuple<Args&&...> args, std::index_sequence<I...> axis_indices) {
  auto& body = std::get<sizeof...(I)>(args);
  using Axes = std::tuple<const std::remove_cvref_t<std::tuple_element_t<I, std::tuple<Args...>>>&...>;
  run_typed(Axes(std::get<I>(args)...), body, axis_indices);
}

}  // namespace internal

// Runs body(value of axis 0, value of axis 1, ...) for every combination of the axes' values.
template <class... Args>
requires internal::AxesThenBody<Args...>
void subtests(Args&&... axes_then_body) {
  internal::split_axes_and_body<Args...>(std::forward_as_tuple(std::forward<Args>(axes_then_body)...),
                                         std::make_index_sequence<sizeof...(Args) - 1>{});
}

// ------------------------------------------------------------------ string-keyed grid

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
  std::string str() const;                                 // "reshard=True, size=3"
};

using Grid = std::vector<std::pair<std::string, std::vector<ParamValue>>>;

void subtests(const Grid& grid, const std::function<void(const Params&)>& fn);

// Every combination of the grid, in run order.
std::vector<Params> expand_grid(const Grid& grid);

}  // namespace tdc::harness
