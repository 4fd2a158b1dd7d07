#include "tdc/harness/subtests.h"

#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "internal.h"

namespace tdc::harness {

std::string to_string(const ParamValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>)
          return x ? "True" : "False";  // PyTorch's spelling
        else if constexpr (std::is_same_v<T, std::string>)
          return x;
        else
          return fmt::format("{}", x);
      },
      v);
}

const ParamValue& Params::value(const std::string& name) const {
  for (auto& [k, v] : items)
    if (k == name) return v;
  std::vector<std::string> keys;
  for (auto& kv : items) keys.push_back(kv.first);
  throw std::out_of_range(
      fmt::format("subtest parameter '{}' does not exist (parameters: {})", name, fmt::join(keys, ", ")));
}

std::string Params::str() const {
  std::vector<std::string> parts;
  for (auto& [k, v] : items) parts.push_back(k + "=" + to_string(v));
  return fmt::format("{}", fmt::join(parts, ", "));
}

namespace {

// [Note: every rank runs the same combinations in the same order]
// The barrier after each combination pairs every rank's k-th combination with the others' k-th,
// and collectives inside a combination pair up the same way. So the order depends on the axes
// alone, never on rank-local state: combinations() is a function of the axis sizes, and both
// forms (typed and string-keyed) go through it.

// Every combination of the axes' value indices, in run order: the last axis varies fastest, as
// itertools.product does. Throws std::invalid_argument naming an axis without values.
std::vector<std::vector<size_t>> combinations(const std::vector<internal::AxisLabels>& axes) {
  std::vector<std::vector<size_t>> out(1);
  for (const auto& axis : axes) {
    if (axis.values.empty())
      throw std::invalid_argument(fmt::format("subtest parameter '{}' has no values", axis.name));
    std::vector<std::vector<size_t>> next;
    for (const auto& partial : out)
      for (size_t i = 0; i < axis.values.size(); ++i) {
        next.push_back(partial);
        next.back().push_back(i);
      }
    out = std::move(next);
  }
  return out;
}

// "name=value, name=value": the text every failure of the combination carries.
std::string label_of(const std::vector<internal::AxisLabels>& axes, const std::vector<size_t>& index) {
  std::vector<std::string> parts;
  for (size_t k = 0; k < axes.size(); ++k) parts.push_back(axes[k].name + "=" + axes[k].values[index[k]]);
  return fmt::format("{}", fmt::join(parts, ", "));
}

std::vector<internal::AxisLabels> labels_of(const Grid& grid) {
  std::vector<internal::AxisLabels> axes;
  for (const auto& [name, values] : grid) {
    internal::AxisLabels& axis = axes.emplace_back(internal::AxisLabels{name, {}});
    for (const ParamValue& v : values) axis.values.push_back(to_string(v));
  }
  return axes;
}

Params params_of(const Grid& grid, const std::vector<size_t>& index) {
  Params p;
  for (size_t k = 0; k < grid.size(); ++k) p.items.emplace_back(grid[k].first, grid[k].second[index[k]]);
  return p;
}

// Runs one combination as a named subtest: its failures carry `label`, an exception fails it
// without stopping the others, and every rank meets the others afterwards (as run_subtests does).
void run_one(const std::string& label, const std::function<void()>& body) {
  auto& current = detail::subtest_label();
  current = label;
  try {
    body();
  } catch (const detail::PeerLeft&) {
    current.clear();
    throw;  // a peer failed or skipped and left: this rank's body ends too
  } catch (const c10::Error& e) {
    ADD_FAILURE() << "uncaught exception: " << e.what_without_backtrace();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "uncaught exception: " << e.what();
  }
  current.clear();
  if (in_rank()) barrier();
}

}  // namespace

// See [Note: every rank runs the same combinations in the same order].
void internal::run_subtests(const std::vector<AxisLabels>& axes,
                            const std::function<void(const std::vector<size_t>&)>& body) {
  for (const auto& index : combinations(axes)) run_one(label_of(axes, index), [&] { body(index); });
}

std::vector<Params> expand_grid(const Grid& grid) {
  std::vector<Params> out;
  for (const auto& index : combinations(labels_of(grid))) out.push_back(params_of(grid, index));
  return out;
}

void subtests(const Grid& grid, const std::function<void(const Params&)>& fn) {
  internal::run_subtests(labels_of(grid), [&](const std::vector<size_t>& index) { fn(params_of(grid, index)); });
}

}  // namespace tdc::harness
