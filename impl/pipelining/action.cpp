// Actions in PyTorch's text form (_Action.__repr__ / _Action.from_str) and whole schedules as text.
#include <array>
#include <cctype>
#include <charconv>
#include <utility>

#include <fmt/format.h>

#include "tdc/pipelining/schedule_ir.h"

namespace tdc::pipelining {

namespace {

// In the order of PyTorch's _action_regex alternation. No name is a prefix of another, so the
// first name that matches is the regex's match.
constexpr std::array<std::pair<ActionType, std::string_view>, 11> kRegexTypes = {{
    {ActionType::Forward, "F"},
    {ActionType::BackwardInput, "I"},
    {ActionType::FullBackward, "B"},
    {ActionType::BackwardWeight, "W"},
    {ActionType::Unshard, "UNSHARD"},
    {ActionType::Reshard, "RESHARD"},
    {ActionType::ReduceGrad, "REDUCE_GRAD"},
    {ActionType::SendF, "SEND_F"},
    {ActionType::RecvF, "RECV_F"},
    {ActionType::SendB, "SEND_B"},
    {ActionType::RecvB, "RECV_B"},
}};

constexpr std::string_view kOverlapSuffix = ")OVERLAP_F_B";

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

[[noreturn]] void invalid(std::string_view text, std::string_view why) {
  throw ScheduleError(
      fmt::format("Invalid action string: '{}': {}; should be formatted as "
                  "[stage][action type][(microbatch)] e.g. 2F0, or (0F3;3B1)OVERLAP_F_B",
                  text, why));
}

// The leading run of digits of `s` as an int (removed from `s`); nullopt when there is none.
std::optional<int> take_number(std::string_view& s, std::string_view text) {
  size_t n = 0;
  while (n < s.size() && std::isdigit(static_cast<unsigned char>(s[n]))) ++n;
  if (n == 0) return std::nullopt;
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + n, value);
  if (ec != std::errc() || end != s.data() + n) invalid(text, fmt::format("'{}' does not fit an int", s.substr(0, n)));
  s.remove_prefix(n);
  return value;
}

std::optional<ActionType> take_type(std::string_view& s) {
  for (const auto& [type, name] : kRegexTypes) {
    if (s.starts_with(name)) {
      s.remove_prefix(name.size());
      return type;
    }
  }
  return std::nullopt;
}

// UNSHARD, RESHARD and REDUCE_GRAD act on a whole stage; everything else on one microbatch.
bool takes_microbatch(ActionType t) {
  return t != ActionType::Unshard && t != ActionType::Reshard && t != ActionType::ReduceGrad;
}

// `<stage><TYPE><mb>`: PyTorch's regex, then nothing else (PyTorch ignores what follows a match).
// `text` is the whole string the errors name (a sub-action's container, or the action itself).
Action parse_single(std::string_view part, std::string_view text) {
  std::string_view rest = part;
  std::optional<int> stage = take_number(rest, text);
  if (!stage) invalid(text, "it does not start with a stage index");
  std::optional<ActionType> type = take_type(rest);
  if (!type) invalid(text, fmt::format("unknown action type at '{}'", rest));
  std::optional<int> mb = take_number(rest, text);
  if (!rest.empty()) invalid(text, fmt::format("trailing '{}' after the action", rest));
  if (takes_microbatch(*type) && !mb) invalid(text, fmt::format("{} needs a microbatch index", to_string(*type)));
  if (!takes_microbatch(*type) && mb) invalid(text, fmt::format("{} takes no microbatch index", to_string(*type)));
  return Action{*stage, *type, mb, {}};
}

// `(a;b;...)OVERLAP_F_B`. Like PyTorch, the container's stage is -1 and it has no microbatch.
Action parse_overlap(std::string_view text) {
  if (!text.ends_with(kOverlapSuffix)) invalid(text, "a parenthesised action list must end with ')OVERLAP_F_B'");
  std::string_view inner = text.substr(1, text.size() - 1 - kOverlapSuffix.size());
  Action overlap{-1, ActionType::OverlapFB, std::nullopt, {}};
  while (true) {
    size_t semi = inner.find(';');
    std::string_view part = trim(inner.substr(0, semi));
    if (part.empty()) invalid(text, "empty sub-action");
    Action sub = parse_single(part, text);
    if (!sub.is_compute()) invalid(text, fmt::format("sub-action '{}' is not a compute action", part));
    overlap.sub_actions.push_back(std::move(sub));
    if (semi == std::string_view::npos) break;
    inner.remove_prefix(semi + 1);
  }
  return overlap;
}

}  // namespace

std::string_view to_string(ActionType type) {
  switch (type) {
    case ActionType::Forward:
      return "F";
    case ActionType::BackwardInput:
      return "I";
    case ActionType::BackwardWeight:
      return "W";
    case ActionType::Unshard:
      return "UNSHARD";
    case ActionType::Reshard:
      return "RESHARD";
    case ActionType::SendF:
      return "SEND_F";
    case ActionType::RecvF:
      return "RECV_F";
    case ActionType::SendB:
      return "SEND_B";
    case ActionType::RecvB:
      return "RECV_B";
    case ActionType::FullBackward:
      return "B";
    case ActionType::OverlapFB:
      return "OVERLAP_F_B";
    case ActionType::ReduceGrad:
      return "REDUCE_GRAD";
  }
  throw std::invalid_argument(fmt::format("ActionType {} is not a known action type", static_cast<int>(type)));
}

bool Action::is_compute() const {
  switch (type) {
    case ActionType::Forward:
    case ActionType::FullBackward:
    case ActionType::BackwardInput:
    case ActionType::BackwardWeight:
    case ActionType::OverlapFB:
      return true;
    default:
      return false;
  }
}

std::vector<Action> Action::leaves() const {
  if (!sub_actions.empty()) return sub_actions;
  return {*this};
}

std::string Action::str() const {
  if (!sub_actions.empty()) {
    std::string out = "(";
    for (size_t i = 0; i < sub_actions.size(); ++i) out += (i ? ";" : "") + sub_actions[i].str();
    return out + ")" + std::string(to_string(type));
  }
  std::string out = std::to_string(stage) + std::string(to_string(type));
  if (microbatch) out += std::to_string(*microbatch);
  return out;
}

std::optional<Action> parse_action(std::string_view text) {
  std::string_view s = trim(text);
  if (s.empty()) return std::nullopt;
  if (s.front() == '(') return parse_overlap(s);
  return parse_single(s, s);
}

std::string format_order(const ComputeOrder& order) {
  std::string out;
  for (const auto& [rank, actions] : order) {
    out += fmt::format("rank {}:", rank);
    for (const auto& a : actions) out += " " + (a ? a->str() : std::string("."));
    out += "\n";
  }
  return out;
}

std::string format_lists(const ActionLists& lists) {
  std::string out;
  for (const auto& [rank, actions] : lists) {
    out += fmt::format("rank {}:", rank);
    for (const auto& a : actions) out += " " + a.str();
    out += "\n";
  }
  return out;
}

}  // namespace tdc::pipelining
