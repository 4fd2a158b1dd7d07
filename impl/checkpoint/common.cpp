// Boxes, strict JSON and checksums for DCP (common.h).
#include "common.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tdc/checkpoint/errors.h"
#include "tdc/tensor/detail/layout.h"

namespace tdc::checkpoint::detail {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::vector<Box> local_boxes(const Value& value) {
  if (const auto* t = std::get_if<at::Tensor>(&value)) {
    Box b{std::vector<int64_t>(t->dim(), 0), t->sizes().vec(), std::vector<int64_t>(t->dim(), 0)};
    return {b};
  }
  const auto& d = std::get<tensor::DTensor>(value);
  const auto runs = tensor::detail::local_runs_at(d.spec(), d.device_mesh().get_coordinate());
  std::vector<Box> boxes{Box{}};
  for (const auto& dim_runs : runs) {
    std::vector<Box> next;
    for (const Box& b : boxes) {
      int64_t local = 0;
      for (const auto& r : dim_runs) {
        Box n = b;
        n.offsets.push_back(r.start);
        n.sizes.push_back(r.len);
        n.local_offsets.push_back(local);
        local += r.len;
        next.push_back(std::move(n));
      }
    }
    boxes = std::move(next);
  }
  std::vector<Box> nonempty;
  for (const Box& b : boxes) {
    if (b.numel() > 0) nonempty.push_back(b);
  }
  if (nonempty.empty()) return {boxes.front()};
  return nonempty;
}

at::Tensor narrow_to(const at::Tensor& t, const std::vector<int64_t>& t_offsets, const std::vector<int64_t>& offsets,
                     const std::vector<int64_t>& sizes) {
  at::Tensor out = t;
  for (size_t d = 0; d < sizes.size(); ++d) {
    out = out.narrow(static_cast<int64_t>(d), offsets[d] - t_offsets[d], sizes[d]);
  }
  return out;
}

std::optional<Range> intersect(const std::vector<int64_t>& a_off, const std::vector<int64_t>& a_size,
                               const std::vector<int64_t>& b_off, const std::vector<int64_t>& b_size) {
  Range r;
  for (size_t d = 0; d < a_off.size(); ++d) {
    const int64_t lo = std::max(a_off[d], b_off[d]);
    const int64_t hi = std::min(a_off[d] + a_size[d], b_off[d] + b_size[d]);
    if (hi <= lo) return std::nullopt;
    r.offsets.push_back(lo);
    r.sizes.push_back(hi - lo);
  }
  return r;
}

nlohmann::json parse_strict_json(std::string_view text, int max_depth, const std::string& where,
                                 const std::string& what) {
  using json = nlohmann::json;
  auto fail = [&](const std::string& problem) {
    throw CheckpointError(fmt::format("{}: {} {}", where, what, problem));
  };
  std::vector<std::set<std::string>> objects;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > max_depth) fail(fmt::format("nests deeper than {} levels", max_depth));
    if (event == json::parse_event_t::object_start) objects.emplace_back();
    if (event == json::parse_event_t::object_end && !objects.empty()) objects.pop_back();
    if (event == json::parse_event_t::key && !objects.empty() &&
        !objects.back().insert(parsed.get<std::string>()).second) {
      fail(fmt::format("has the key '{}' twice in one object", parsed.get<std::string>()));
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail(fmt::format("is not valid JSON: {}", e.what()));
  }
  return {};
}

std::optional<uint64_t> parse_hex64(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(digit);
  }
  return v;
}

}  // namespace tdc::checkpoint::detail
