// `tdc bench kernel`: `tdc_bench kernel` times the kernel events a Gloo collective is made of
// ([Note: the kernel's price of a collective], bench/cpp/bench_kernel.cpp); the table of their
// prices on this machine.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/support.h"
#include "cli.h"

namespace tdc::cli::bench {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void print_price(const char* event, const json& price, const fs::path& out) {
  if (price.is_null()) {
    fmt::print("{:<38} {:>9} {:>10}\n", event, "-", "- (one CPU only)");
    return;
  }
  fmt::print("{:<38} {:>9.2f} {:>10.2f}\n", event, number_at(price, out, "wall_us"),
             number_at(price, out, "system_us"));
}

int print_kernel(const json& j, const fs::path& out) {
  fmt::print("\nkernel benchmark: host {} ({} CPUs), {}, kernel {}\n", j.value("host", std::string("?")),
             j.value("cpus", 0), j.value("cpu_model", std::string("?")), j.value("kernel", std::string("?")));
  const json mitigations = j.value("mitigations", json::object());
  for (const auto& [flaw, text] : mitigations.items()) fmt::print("  {}: {}\n", flaw, text.get<std::string>());
  fmt::print("{:<38} {:>9} {:>10}\n", "event (median of rounds)", "wall_us", "system_us");
  fmt::print("{:<38} {:>9.3f} {:>10}\n", "null system call", number_at(j, out, "null_syscall_ns") / 1000, "");
  print_price("thread hand-off, one CPU", j.at("thread_hand_off"), out);
  print_price("64-byte loopback TCP message, one CPU", j.at("tcp_message_one_cpu"), out);
  print_price("64-byte loopback TCP message, two CPUs", j.at("tcp_message_two_cpus"), out);
  fmt::print(
      "\nA collective on Gloo is two thread hand-offs and, per peer, up to three TCP messages each way;\n"
      "docs/bench/suite_time.md multiplies these prices by the seed suite's counts.\nwritten to {}\n",
      out.string());
  return kExitOk;
}

}  // namespace

int bench_kernel(const ParsedArgs&, const fs::path& build, const fs::path& out, std::optional<int> repeat) {
  int status = kExitOk;
  std::optional<json> j = run_benchmark(build, "kernel", out, repeat.value_or(5), &status);
  return j ? print_kernel(*j, out) : status;
}

}  // namespace tdc::cli::bench
