// `tdc bench checkpoint`: R rounds of `tdc_bench checkpoint` (tdc's save/load, and dd on the same
// disk) and bench/pytorch/checkpoint_pytorch.py (PyTorch's DCP), merged (best over rounds) and plotted.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/support.h"
#include "cli.h"

namespace tdc::cli::bench {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Throughputs (MB/s) of one world size, and the ratios between them: "X_vs_Y" = X's MB/s / Y's
// (higher is better for X). Targets: tdc >= PyTorch (save_vs_pytorch, load_vs_pytorch >= 1) and
// within 2x of dd (save_vs_dd, load_vs_dd >= 0.5); loads are the cold ones (files dropped from the
// page cache, as dd's read).
constexpr const char* kCkptThroughputs[] = {"tdc_save_mb_s",     "tdc_load_mb_s",     "tdc_load_warm_mb_s",
                                            "pytorch_save_mb_s", "pytorch_load_mb_s", "pytorch_load_warm_mb_s",
                                            "dd_write_mb_s",     "dd_read_mb_s"};
struct CkptRatio {
  const char* name;
  const char* num;
  const char* den;
  double target;  // 0: reported, no target
};
constexpr CkptRatio kCkptRatios[] = {
    {"save_vs_pytorch", "tdc_save_mb_s", "pytorch_save_mb_s", 1.0},
    {"load_vs_pytorch", "tdc_load_mb_s", "pytorch_load_mb_s", 1.0},
    {"save_vs_dd", "tdc_save_mb_s", "dd_write_mb_s", 0.5},
    {"load_vs_dd", "tdc_load_mb_s", "dd_read_mb_s", 0.5},
    {"load_warm_vs_pytorch", "tdc_load_warm_mb_s", "pytorch_load_warm_mb_s", 0.0},
    {"pytorch_save_vs_dd", "pytorch_save_mb_s", "dd_write_mb_s", 0.0},
    {"pytorch_load_vs_dd", "pytorch_load_mb_s", "dd_read_mb_s", 0.0},
};

// Sets the ratios of a case from its throughputs and the target verdicts over all cases.
void checkpoint_verdicts(ojson& j) {
  bool vs_pytorch = true, vs_dd = true;
  double worst_pytorch = 0, worst_dd = 0;
  bool first = true;
  for (auto& [world, c] : j["cases"].items()) {
    for (const CkptRatio& r : kCkptRatios) {
      const double den = c.value(r.den, 0.0);
      c[r.name] = den > 0 ? c.value(r.num, 0.0) / den : 0.0;
    }
    const double p = std::min(c["save_vs_pytorch"].get<double>(), c["load_vs_pytorch"].get<double>());
    const double d = std::min(c["save_vs_dd"].get<double>(), c["load_vs_dd"].get<double>());
    worst_pytorch = first ? p : std::min(worst_pytorch, p);
    worst_dd = first ? d : std::min(worst_dd, d);
    first = false;
    vs_pytorch = vs_pytorch && p >= 1.0;
    vs_dd = vs_dd && d >= 0.5;
  }
  j["target"] =
      "in every case: tdc's save and (cold) load MB/s >= PyTorch's (save_vs_pytorch, load_vs_pytorch >= 1), and "
      ">= half of dd's sequential write / read (save_vs_dd, load_vs_dd >= 0.5)";
  j["target_met"] = vs_pytorch && vs_dd;
  j["target_vs_pytorch_met"] = vs_pytorch;
  j["target_vs_dd_met"] = vs_dd;
  j["worst_vs_pytorch"] = worst_pytorch;
  j["worst_vs_dd"] = worst_dd;
}

// tdc's JSON (`tdc_bench checkpoint`, with dd) + PyTorch's (checkpoint_pytorch.py) -> one round.
ojson merge_checkpoint(const ojson& t, const fs::path& tdc_file, const ojson& py, const fs::path& py_file) {
  const ojson& tsd = t.at("state_dict");
  if (!py.contains("state_dict") || py["state_dict"].value("tensors", ojson()) != tsd.at("tensors") ||
      py["state_dict"].value("total_bytes", -1) != tsd.value("total_bytes", -2))
    throw std::runtime_error(fmt::format("'{}' and '{}' describe different state dicts: not the same benchmark",
                                         tdc_file.string(), py_file.string()));
  const ojson& dd = t.at("dd");
  ojson cases = ojson::object();
  for (const auto& [world, c] : t.at("cases").items()) {
    const std::string where = fmt::format("cases.{}", world);
    if (!py.contains("cases") || !py["cases"].contains(world))
      throw std::runtime_error(fmt::format("PyTorch output '{}' has no case {}", py_file.string(), where));
    const ojson& p = py["cases"][world];
    ojson m = ojson::object();
    for (const char* k : {"save", "load", "load_warm"}) {
      m[fmt::format("tdc_{}_mb_s", k)] = number_in(c, tdc_file, where, fmt::format("{}_mb_s", k));
      m[fmt::format("pytorch_{}_mb_s", k)] = number_in(p, py_file, where, fmt::format("{}_mb_s", k));
    }
    m["dd_write_mb_s"] = number_in(dd, tdc_file, "dd", "write_mb_s");
    m["dd_read_mb_s"] = number_in(dd, tdc_file, "dd", "read_mb_s");
    m["tdc_files"] = c.value("files", 0);
    m["pytorch_files"] = p.value("files", 0);
    m["tdc_checkpoint_bytes"] = c.value("checkpoint_bytes", 0);
    m["pytorch_checkpoint_bytes"] = p.value("checkpoint_bytes", 0);
    m["resident_before_cold_load"] =
        std::max(c.value("resident_before_cold_load", 0.0), p.value("resident_before_cold_load", 0.0));
    ojson ts = ojson::object(), ps = ojson::object();
    for (const char* k : {"save_s_all", "load_s_all", "load_warm_s_all"}) {
      ts[k] = c.value(k, ojson::array());
      ps[k] = p.value(k, ojson::array());
    }
    m["tdc_seconds"] = ts;
    m["pytorch_seconds"] = ps;
    cases[world] = m;
  }
  ojson out = ojson::object();
  out["cases"] = cases;
  checkpoint_verdicts(out);
  add_run_info(out, t, py, {"cases"}, {"cases", "state_dict"});
  return out;
}

// Several rounds -> one: every throughput is the best over rounds (as each round's is the best over
// repeats), the ratios are taken between those; each case keeps its rounds under "per_round" and
// dd its rounds under "dd.per_round".
ojson combine_checkpoint_rounds(const std::vector<ojson>& rounds) {
  ojson out = rounds.front();
  for (auto& [world, c] : out["cases"].items()) {
    ojson per_round = ojson::array();
    for (const auto& r : rounds) {
      const ojson& rc = r["cases"][world];
      per_round.push_back(rc);
      for (const char* k : kCkptThroughputs) c[k] = std::max(c.value(k, 0.0), rc.value(k, 0.0));
      c["resident_before_cold_load"] =
          std::max(c.value("resident_before_cold_load", 0.0), rc.value("resident_before_cold_load", 0.0));
    }
    c.erase("tdc_seconds");
    c.erase("pytorch_seconds");
    c["per_round"] = per_round;
  }
  checkpoint_verdicts(out);
  ojson dd_rounds = ojson::array();
  for (const auto& r : rounds) {
    dd_rounds.push_back(r["dd"]);
    for (const char* k : {"write_mb_s", "read_mb_s"})
      out["dd"][k] = std::max(out["dd"].value(k, 0.0), r["dd"].value(k, 0.0));
  }
  out["dd"]["per_round"] = dd_rounds;
  for (const char* k : {"write_s", "read_s", "write_s_all", "read_s_all", "write_wall_s_all", "read_wall_s_all"})
    out["dd"].erase(k);
  ojson loads = ojson::array();
  double total = 0;
  for (const auto& r : rounds) {
    loads.push_back(r.value("load_average", ojson()));
    loads.push_back(r["pytorch"].value("load_average", ojson()));
    total += r.value("duration_s", 0.0) + r["pytorch"].value("duration_s", 0.0);
  }
  out["load_average"] = loads;
  out["rounds"] = rounds.size();
  out["total_duration_s"] = total;
  return out;
}

int print_checkpoint(const ojson& j, const fs::path& out, const fs::path& png) {
  const ojson& sd = j["state_dict"];
  const ojson& disk = j["disk"];
  fmt::print(
      "\nCheckpoint benchmark: host {} ({} CPUs), LibTorch {} vs torch {}; {:.1f} MB of float32 in {} tensors "
      "(DTensor Shard(0)); best of {} call(s) x {} round(s); directory {} ({} on {})\n",
      j.value("host", std::string("?")), j.value("cpus", 0), j.value("libtorch_version", std::string("?")),
      j.value("torch_version", std::string("?")), sd.value("total_bytes", 0) / 1e6, sd["tensors"].size(),
      j.value("repeat", 0), j.value("rounds", 1), disk.value("dir", std::string("?")),
      disk.value("fstype", std::string("?")), disk.value("device", std::string("?")));
  fmt::print("{:>5}  {:<11} {:>10} {:>12} {:>9} {:>11} {:>8} {:>10}\n", "world", "", "tdc MB/s", "PyTorch MB/s",
             "dd MB/s", "tdc/PyTorch", "tdc/dd", "PyTorch/dd");
  for (const auto& [world, c] : j["cases"].items()) {
    auto mark = [](double r, double target) { return r >= target ? " " : "<"; };
    const double sp = c.value("save_vs_pytorch", 0.0), sdd = c.value("save_vs_dd", 0.0);
    const double lp = c.value("load_vs_pytorch", 0.0), ldd = c.value("load_vs_dd", 0.0);
    fmt::print("{:>5}  {:<11} {:>10.0f} {:>12.0f} {:>9.0f} {:>10.2f}{} {:>7.2f}{} {:>10.2f}\n", world, "save",
               c.value("tdc_save_mb_s", 0.0), c.value("pytorch_save_mb_s", 0.0), c.value("dd_write_mb_s", 0.0), sp,
               mark(sp, 1.0), sdd, mark(sdd, 0.5), c.value("pytorch_save_vs_dd", 0.0));
    fmt::print("{:>5}  {:<11} {:>10.0f} {:>12.0f} {:>9.0f} {:>10.2f}{} {:>7.2f}{} {:>10.2f}\n", world, "load (cold)",
               c.value("tdc_load_mb_s", 0.0), c.value("pytorch_load_mb_s", 0.0), c.value("dd_read_mb_s", 0.0), lp,
               mark(lp, 1.0), ldd, mark(ldd, 0.5), c.value("pytorch_load_vs_dd", 0.0));
    fmt::print("{:>5}  {:<11} {:>10.0f} {:>12.0f} {:>9} {:>10.2f}\n", world, "load (warm)",
               c.value("tdc_load_warm_mb_s", 0.0), c.value("pytorch_load_warm_mb_s", 0.0), "-",
               c.value("load_warm_vs_pytorch", 0.0));
  }
  const ojson& dd = j["dd"];
  fmt::print(
      "\nMB = 10^6 bytes of tensor data; each figure is the best call (slowest rank's time) over repeats and rounds.\n"
      "load (cold): the checkpoint's files dropped from the page cache first (posix_fadvise DONTNEED; at most "
      "{:.0f}% of their pages stayed resident); dd read likewise ({:.0f}%).\n"
      "dd: write = {}, read = {}.\n"
      "target: tdc/PyTorch >= 1: {} (worst {:.2f}); tdc/dd >= 0.5: {} (worst {:.2f}); '<' marks a miss\n",
      100 * j["cases"].begin()->value("resident_before_cold_load", 0.0), 100 * dd.value("resident_before_read", 0.0),
      dd.value("write_command", std::string("?")), dd.value("read_command", std::string("?")),
      j.value("target_vs_pytorch_met", false) ? "met" : "NOT met", j.value("worst_vs_pytorch", 0.0),
      j.value("target_vs_dd_met", false) ? "met" : "NOT met", j.value("worst_vs_dd", 0.0));
  const int cpus = j.value("cpus", 0);
  if (cpus > 0 && cpus < 4) fmt::print("note: {} CPUs here, so world size 4 oversubscribes the cores\n", cpus);
  fmt::print("written to {}\n           {}\n", out.string(), png.string());
  return kExitOk;
}

}  // namespace

int bench_checkpoint(const ParsedArgs& a, const fs::path& build, const fs::path& out, std::optional<int> repeat) {
  const PythonSide py = python_side(a, build, "checkpoint");
  const int mb = a.get("mb") ? parse_positive_int("bench", "mb", *a.get("mb")) : 256;
  // One directory for dd, tdc and PyTorch: the disk under test (default: the build directory's).
  const fs::path dir = fs::absolute(a.get("dir").value_or(build.string()));
  if (!fs::is_directory(dir))
    throw UsageError(fmt::format("bench checkpoint: --dir '{}' is not a directory", dir.string()));
  std::vector<std::string> tdc_args{"--mb", std::to_string(mb), "--dir", dir.string()};
  std::vector<std::string> python_args = tdc_args;
  add_worlds(a, tdc_args, python_args);
  const Rounds spec{.name = "checkpoint",
                    .repeat = repeat.value_or(3),
                    .rounds = a.get("rounds") ? parse_positive_int("bench", "rounds", *a.get("rounds")) : 2,
                    .tdc_args = tdc_args,
                    .python_args = python_args,
                    .merge = merge_checkpoint,
                    .combine = combine_checkpoint_rounds,
                    .print = print_checkpoint};
  return run_rounds(spec, build, py, out);
}

}  // namespace tdc::cli::bench
