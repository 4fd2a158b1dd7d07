// The lifecycle check libtdc's components share (FSDP1, FSDP2): is `now` one of the states an action allows?
#pragma once

#include <initializer_list>
#include <string>

namespace tdc::core {

// Returns when `now` is in `allowed`; otherwise calls fail(now, "A or B") with the states' names
// (to_string found by argument-dependent lookup), which throws the caller's error.
template <class State, class Fail>
void check_transition(State now, std::initializer_list<State> allowed, Fail&& fail) {
  for (State s : allowed) {
    if (s == now) return;
  }
  std::string expected;
  for (State s : allowed) expected += (expected.empty() ? "" : " or ") + std::string(to_string(s));
  fail(std::string(to_string(now)), expected);
}

}  // namespace tdc::core
