// Checkpoint benchmark, tdc side: save and load throughput (MB/s) of tdc::checkpoint on an
// FSDP-sharded state dict at world sizes 2 and 4 (fork launcher, 1 ATen thread per rank), and the
// disk's sequential write and read bandwidth measured with dd in the same directory.
//
//   tdc_bench checkpoint --out FILE [--repeat N] [--worlds 2|4|2,4] [--mb MB] [--dir DIR]
//                                                 (or: ./tdc bench checkpoint --out FILE)
//
// `tdc bench checkpoint` runs this, then bench/pytorch/checkpoint_pytorch.py (PyTorch's DCP
// HuggingFace writer/reader on the same state dict, world sizes and directory) and merges both into
// one JSON + a PNG plot.
//
// The state dict (layout(); the PyTorch runner has the same rule): 8 layers, "layers.<i>.weight"
// float32 [rows_i, 1024] and "layers.<i>.bias" float32 [rows_i], rows_i odd (4k+1 / 4k+3: uneven
// shards at world 2 and 4) and large enough that the 16 tensors hold at least MB * 10^6 bytes.
// Every entry is a DTensor Shard(0) over a 1-D mesh of the world, laid out as FSDP2 shards a
// parameter (ceil(rows / world) rows per rank, the last rank fewer), random normal values.
//
// Per world size, N repeats of: save into a fresh directory; cold load (every file of the
// checkpoint dropped from the page cache first: fsync + posix_fadvise(DONTNEED), and mincore
// records what stayed resident) into a second state dict of the same layout; warm load (the same
// again, the files now cached). Each call is timed from the end of a barrier to its return; a
// repeat's figure is the slowest rank's (all-reduce MAX), the case's the best over repeats. The
// first load is compared bit-exact with what was saved.
//
// dd, N repeats in the same directory: write = `dd if=SRC of=dd.bin bs=4M count=K conv=fsync`
// (SRC: random bytes written and fsynced beforehand, still in the page cache, so dd reads it at
// memory speed; zeros could be compressed or skipped by a storage layer); read = `dd if=dd.bin
// of=/dev/null bs=4M` after dropping dd.bin from the page cache the same way as the checkpoint
// files. Seconds as dd reports them (LC_ALL=C); bytes = K * 4 MiB >= the state dict's bytes.
// MB = 10^6 bytes throughout. Output schema: docs/results-schema.md, "Checkpoint benchmark"
// ("tdc" part).
#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "tdc/checkpoint/checkpoint.h"
#include "tdc/comm/collectives.h"
#include "tdc/conformance/support.h"
#include "tdc/device_mesh.h"
#include "tdc/harness/launch.h"
#include "tdc/harness/results.h"
#include "tdc/tensor/dtensor.h"

#include "benchmarks.h"

extern char** environ;

namespace bench_checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int kDefaultMb = 256;
constexpr int kLayers = 8;
constexpr int64_t kCols = 1024;
constexpr int64_t kItemsize = 4;  // float32
constexpr int64_t kDdBlock = int64_t{4} << 20;

struct TensorShape {
  std::string key;
  std::vector<int64_t> shape;
};

// The state dict's keys and global shapes for at least `mb` * 10^6 bytes (checkpoint_pytorch.py's
// layout() is the same rule).
std::vector<TensorShape> layout(int64_t mb) {
  const int64_t budget = mb * 1'000'000 / kLayers;  // bytes per layer (weight + bias)
  const int64_t base = (budget + kItemsize * (kCols + 1) - 1) / (kItemsize * (kCols + 1));
  std::vector<TensorShape> out;
  for (int i = 0; i < kLayers; ++i) {
    int64_t rows = base / 4 * 4 + (i % 2 == 0 ? 1 : 3);
    if (rows < base) rows += 4;
    out.push_back({fmt::format("layers.{}.weight", i), {rows, kCols}});
    out.push_back({fmt::format("layers.{}.bias", i), {rows}});
  }
  return out;
}

int64_t total_bytes(const std::vector<TensorShape>& lay) {
  int64_t n = 0;
  for (const auto& t : lay) {
    int64_t e = kItemsize;
    for (int64_t s : t.shape) e *= s;
    n += e;
  }
  return n;
}

// ------------------------------------------------------------------ page cache and the disk

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// Drops the file from the page cache: fsync (DONTNEED leaves dirty pages), then DONTNEED.
void evict(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  ::fsync(fd);
  int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (rc != 0) throw std::runtime_error(fmt::format("posix_fadvise('{}'): {}", path.string(), std::strerror(rc)));
}

struct Residency {
  int64_t resident = 0, pages = 0;
  double fraction() const { return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0.0; }
};

// Pages of the files in the page cache (mincore on a shared read-only mapping).
Residency residency(const std::vector<fs::path>& files) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  Residency r;
  for (const auto& path : files) {
    const auto size = static_cast<int64_t>(fs::file_size(path));
    if (size == 0) continue;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw std::runtime_error(fmt::format("mmap '{}': {}", path.string(), std::strerror(errno)));
    const int64_t pages = (size + page - 1) / page;
    std::vector<unsigned char> vec(static_cast<size_t>(pages));
    const int rc = ::mincore(p, static_cast<size_t>(size), vec.data());
    ::munmap(p, static_cast<size_t>(size));
    if (rc != 0) throw std::runtime_error(fmt::format("mincore '{}': {}", path.string(), std::strerror(errno)));
    for (unsigned char v : vec) r.resident += v & 1;
    r.pages += pages;
  }
  return r;
}

// The mount that holds `path` (longest mount point prefix in /proc/mounts).
json filesystem_of(const fs::path& path) {
  const std::string real = fs::canonical(path).string();
  std::ifstream in("/proc/mounts");
  std::string line;
  json best = {{"dir", real}, {"mount_point", "?"}, {"fstype", "?"}, {"device", "?"}, {"options", "?"}};
  size_t best_len = 0;
  auto unescape = [](const std::string& s) {  // /proc/mounts writes ' ' as \040 and so on
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\\' && i + 3 < s.size()) {
        out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
        i += 3;
      } else {
        out += s[i];
      }
    }
    return out;
  };
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string dev, mnt, type, opts;
    if (!(ss >> dev >> mnt >> type >> opts)) continue;
    mnt = unescape(mnt);
    const bool under = mnt == "/" || real == mnt || real.rfind(mnt + "/", 0) == 0;
    if (under && mnt.size() >= best_len) {
      best_len = mnt.size();
      best["mount_point"] = mnt;
      best["fstype"] = type;
      best["device"] = unescape(dev);
      best["options"] = opts;
    }
  }
  return best;
}

std::vector<double> load_average() {
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  in >> a >> b >> c;
  return {a, b, c};
}

// A directory for the checkpoints and dd's files under `parent` (mkdtemp), removed with the object.
class DataDir {
 public:
  explicit DataDir(const fs::path& parent) {
    fs::create_directories(parent);
    std::string tmpl = (parent / "tdc-bench-checkpoint-XXXXXX").string();
    if (!::mkdtemp(tmpl.data()))
      throw std::runtime_error(
          fmt::format("cannot create a directory under '{}': {}", parent.string(), std::strerror(errno)));
    path_ = tmpl;
  }
  ~DataDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  DataDir(const DataDir&) = delete;
  DataDir& operator=(const DataDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ------------------------------------------------------------------ dd

struct DdRun {
  double seconds = 0;  // as dd reports it
  double wall_s = 0;   // around the dd process
  int64_t bytes = 0;
};

// Runs dd with LC_ALL=C, its stderr to a file; throws naming the command and dd's output on failure.
DdRun run_dd(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "LC_ALL=", 7) != 0) env_s.emplace_back(*e);
  env_s.emplace_back("LC_ALL=C");
  std::vector<char*> envp, argv;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_s = {"dd"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const auto t0 = Clock::now();
  const int rc = ::posix_spawnp(&pid, "dd", &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error(fmt::format("cannot run dd: {}", std::strerror(rc)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  DdRun r;
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string command = fmt::format("dd {}", fmt::join(args, " "));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format("'{}' failed: {}", command, out));
  // "268435456 bytes (268 MB, 256 MiB) copied, 2.50154 s, 107 MB/s"
  const auto copied = out.rfind(" bytes");
  const auto comma = out.find("copied, ", copied == std::string::npos ? 0 : copied);
  if (copied == std::string::npos || comma == std::string::npos)
    throw std::runtime_error(fmt::format("'{}': cannot read dd's summary line: {}", command, out));
  const auto line = out.rfind('\n', copied);
  r.bytes = std::stoll(out.substr(line == std::string::npos ? 0 : line + 1));
  r.seconds = std::stod(out.substr(comma + 8));
  return r;
}

// dd's sequential write and read of `bytes` (rounded up to whole 4 MiB blocks) in `dir`.
json measure_dd(const fs::path& dir, int64_t bytes, int repeat) {
  const int64_t count = (bytes + kDdBlock - 1) / kDdBlock;
  const fs::path src = dir / "dd-src.bin", dst = dir / "dd.bin", log = dir / "dd.log";
  {  // SRC: random bytes (a fast generator), fsynced so that it is clean and stays cached.
    std::vector<uint64_t> block(static_cast<size_t>(kDdBlock / 8));
    std::mt19937_64 gen(1234);
    int fd = ::open(src.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error(fmt::format("cannot create '{}': {}", src.string(), std::strerror(errno)));
    for (int64_t b = 0; b < count; ++b) {
      for (auto& w : block) w = gen();
      if (::write(fd, block.data(), kDdBlock) != kDdBlock) {
        ::close(fd);
        throw std::runtime_error(fmt::format("cannot write '{}': {}", src.string(), std::strerror(errno)));
      }
    }
    ::fsync(fd);
    ::close(fd);
  }
  const std::string bs = "bs=4M", cnt = fmt::format("count={}", count);
  std::vector<double> write_s, read_s, write_wall, read_wall;
  double src_resident_min = 1.0, resident_max = 0.0;
  int64_t copied = 0;
  for (int r = 0; r < repeat; ++r) {
    std::error_code ec;
    fs::remove(dst, ec);
    src_resident_min = std::min(src_resident_min, residency({src}).fraction());
    DdRun w = run_dd({"if=" + src.string(), "of=" + dst.string(), bs, cnt, "conv=fsync"}, log);
    evict(dst);
    resident_max = std::max(resident_max, residency({dst}).fraction());
    DdRun rd = run_dd({"if=" + dst.string(), "of=/dev/null", bs}, log);
    write_s.push_back(w.seconds);
    write_wall.push_back(w.wall_s);
    read_s.push_back(rd.seconds);
    read_wall.push_back(rd.wall_s);
    copied = w.bytes;
    fmt::print(stderr, "[dd {}/{}] write {:.0f} MB/s, read {:.0f} MB/s\n", r + 1, repeat, w.bytes / w.seconds / 1e6,
               rd.bytes / rd.seconds / 1e6);
  }
  std::error_code ec;
  fs::remove(src, ec);
  fs::remove(dst, ec);
  fs::remove(log, ec);
  const double best_w = *std::min_element(write_s.begin(), write_s.end());
  const double best_r = *std::min_element(read_s.begin(), read_s.end());
  return {
      {"write_mb_s", copied / best_w / 1e6},
      {"read_mb_s", copied / best_r / 1e6},
      {"write_s", best_w},
      {"read_s", best_r},
      {"write_s_all", write_s},
      {"read_s_all", read_s},
      {"write_wall_s_all", write_wall},
      {"read_wall_s_all", read_wall},
      {"bytes", copied},
      {"write_command", fmt::format("dd if=SRC of=DIR/dd.bin {} {} conv=fsync", bs, cnt)},
      {"read_command", fmt::format("dd if=DIR/dd.bin of=/dev/null {}", bs)},
      {"source", "SRC: random bytes, written and fsynced before the timed runs, in the page cache"},
      {"source_resident_min", src_resident_min},
      {"read_cache", "dd.bin dropped from the page cache before each read (fsync + posix_fadvise POSIX_FADV_DONTNEED)"},
      {"resident_before_read", resident_max},
  };
}

// ------------------------------------------------------------------ tdc's save and load

using tdc::checkpoint::StateDict;

// One world size on the calling rank; rank 0 writes the case's JSON to `result`.
void run_case(const std::vector<TensorShape>& lay, int repeat, const fs::path& base, const std::string& result) {
  auto group = tdc::conformance::world();
  const int world = group->size(), rank = group->rank();
  tdc::DeviceMesh mesh = tdc::init_device_mesh("cpu", {world});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1234 + rank);
  StateDict sd, target;
  for (const auto& t : lay) {
    const int64_t rows = t.shape[0], chunk = (rows + world - 1) / world;
    const int64_t lo = std::min<int64_t>(rank * chunk, rows), hi = std::min(lo + chunk, rows);
    std::vector<int64_t> local = t.shape, stride(t.shape.size(), 1);
    local[0] = hi - lo;
    if (t.shape.size() == 2) stride[0] = t.shape[1];
    tdc::tensor::FromLocalOptions o{t.shape, stride, false};
    tdc::tensor::DTensor d = tdc::tensor::from_local(at::randn(local, gen), mesh, {tdc::tensor::Shard{0}}, o);
    if (d.spec().local_offset()[0] != lo || d.spec().local_shape() != local)
      throw std::logic_error(fmt::format("'{}': rank {}'s shard is not rows [{}, {}) as FSDP2's", t.key, rank, lo, hi));
    sd.set(t.key, d);
    target.set(t.key, tdc::tensor::from_local(at::zeros(local), mesh, {tdc::tensor::Shard{0}}, o));
  }
  auto timed = [&](const std::function<void()>& call) {
    tdc::comm::barrier(group);
    const auto t0 = Clock::now();
    call();
    at::Tensor t = at::full({1}, std::chrono::duration<double>(Clock::now() - t0).count(), at::kDouble);
    tdc::comm::all_reduce(t, tdc::comm::ReduceOp::MAX, group);
    return t.item<double>();
  };
  std::vector<double> save_s, load_s, warm_s;
  double resident_max = 0;
  std::optional<fs::path> previous;
  for (int r = 0; r < repeat; ++r) {
    const fs::path dir = base / fmt::format("tdc-ws{}-r{}", world, r);
    save_s.push_back(timed([&] { tdc::checkpoint::save(sd, dir.string(), {.group = group}); }));
    if (rank == 0 && previous) fs::remove_all(*previous);  // one checkpoint on disk at a time
    previous = dir;
    if (rank == 0) {
      for (const auto& f : files_in(dir)) evict(f);
      resident_max = std::max(resident_max, residency(files_in(dir)).fraction());
    }
    load_s.push_back(timed([&] { tdc::checkpoint::load(target, dir.string(), {.group = group}); }));
    if (r == 0) {
      for (const auto& t : lay) {
        if (!at::equal(tdc::checkpoint::local_tensor(target.at(t.key)), tdc::checkpoint::local_tensor(sd.at(t.key))))
          throw std::runtime_error(fmt::format("rank {}: '{}' loaded differs from what was saved", rank, t.key));
      }
    }
    warm_s.push_back(timed([&] { tdc::checkpoint::load(target, dir.string(), {.group = group}); }));
  }
  if (rank == 0) {
    int files = 0;
    int64_t bytes = 0;
    for (const auto& f : files_in(*previous)) {
      files += f.extension() == ".safetensors";
      bytes += static_cast<int64_t>(fs::file_size(f));
    }
    json r = {{"save_s", *std::min_element(save_s.begin(), save_s.end())},
              {"load_s", *std::min_element(load_s.begin(), load_s.end())},
              {"load_warm_s", *std::min_element(warm_s.begin(), warm_s.end())},
              {"save_s_all", save_s},
              {"load_s_all", load_s},
              {"load_warm_s_all", warm_s},
              {"files", files},
              {"checkpoint_bytes", bytes},
              {"resident_before_cold_load", resident_max}};
    fs::remove_all(*previous);
    std::ofstream(result) << r.dump() << "\n";
  }
  tdc::comm::barrier(group);
}

// --mb and --dir are this program's; the rest goes to tdc::bench::parse_args (--out, --repeat,
// the harness's --tdc_* flags).
struct Extra {
  int64_t mb = kDefaultMb;
  std::string dir;
};

Extra take_extra_args(int* argc, char** argv) {
  const std::string usage = fmt::format(
      "usage: tdc_bench checkpoint --out FILE [--repeat N] [--worlds 2|4|2,4] [--mb MB] [--dir DIR]\n"
      "  N: timed calls per case (best counts; default 3); MB: tensor data in the state dict, 10^6 bytes "
      "(default {}); DIR: where the checkpoints and dd's files go (a temp dir under it; default: this program's "
      "directory, i.e. the build directory)",
      kDefaultMb);
  Extra e;
  int out = 1;
  for (int i = 1; i < *argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const std::string& flag) -> std::optional<std::string> {
      if (arg == flag) {
        if (i + 1 >= *argc) {
          fmt::print(stderr, "tdc_bench checkpoint: error: {} needs a value\n{}\n", flag, usage);
          std::exit(2);
        }
        return std::string(argv[++i]);
      }
      if (arg.rfind(flag + "=", 0) == 0) return arg.substr(flag.size() + 1);
      return std::nullopt;
    };
    if (auto v = value("--mb")) {
      char* end = nullptr;
      const long long n = std::strtoll(v->c_str(), &end, 10);
      if (v->empty() || *end || n < 1 || n > 1'000'000) {
        fmt::print(stderr, "tdc_bench checkpoint: error: --mb must be a positive integer, got '{}'\n{}\n", *v, usage);
        std::exit(2);
      }
      e.mb = n;
    } else if (auto d = value("--dir")) {
      e.dir = *d;
    } else if (arg == "-h" || arg == "--help") {
      fmt::print("{}\n", usage);
      std::exit(0);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  argv[out] = nullptr;
  return e;
}

// `tdc_bench checkpoint` (bench/cpp/main.cpp).
int run(int argc, char** argv) {
  const Extra extra = take_extra_args(&argc, argv);
  const tdc::bench::Args args =
      tdc::bench::parse_args(argc, argv, "tdc_bench checkpoint", 3, "timed calls per case, best counts", true);
  const int repeat = args.repeat;
  const std::vector<TensorShape> lay = layout(extra.mb);
  const int64_t bytes = total_bytes(lay);

  const tdc::bench::TempDir tmp("tdc-bench-checkpoint");  // the cases' result files
  const fs::path parent = extra.dir.empty() ? fs::canonical("/proc/self/exe").parent_path() : fs::path(extra.dir);
  std::optional<DataDir> data;
  try {
    data.emplace(parent);
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc_bench checkpoint: {}\n", e.what());
    return 1;
  }
  auto bench_start = Clock::now();
  std::string started_at = tdc::harness::iso_now();
  const std::vector<double> load_start = load_average();
  const json disk = filesystem_of(data->path());
  fmt::print(stderr, "[tdc] {} MB of float32 in {} tensors; directory {} ({} on {})\n", bytes / 1'000'000, lay.size(),
             data->path().string(), disk["fstype"].get<std::string>(), disk["device"].get<std::string>());

  json dd;
  try {
    dd = measure_dd(data->path(), bytes, repeat);
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdc_bench checkpoint: dd: {}\n", e.what());
    return 1;
  }

  json cases = json::object();
  int done = 0;
  for (int world : args.worlds) {
    const std::string result = (tmp.path() / fmt::format("ws{}.json", world)).string();
    tdc::harness::LaunchSpec spec;
    spec.suite = "CheckpointBench";
    spec.name = fmt::format("save_load_{}", world);
    spec.world_size = world;
    spec.launcher = tdc::harness::Launcher::Fork;
    // 3 calls of `bytes` per repeat at >= 10 MB/s, plus start-up.
    spec.timeout_s = 120 + 3.0 * repeat * static_cast<double>(bytes) / 10e6;
    const std::string label = fmt::format("[tdc {}/{}] save + load, world {}", ++done, args.worlds.size(), world);
    fmt::print(stderr, "{} ... ", label);
    const auto t0 = Clock::now();
    const tdc::harness::Outcome o = tdc::harness::launch(spec, [&] { run_case(lay, repeat, data->path(), result); });
    if (o.status != tdc::harness::Status::Pass) {
      fmt::print(stderr, "{}: {}\n", tdc::harness::to_string(o.status), o.message);
      return 1;
    }
    std::ifstream in(result);
    json c = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded() || !c.contains("save_s")) {
      fmt::print(stderr, "no result written\n");
      return 1;
    }
    fmt::print(stderr, "{:.1f} s\n", std::chrono::duration<double>(Clock::now() - t0).count());
    for (const char* k : {"save", "load", "load_warm"})
      c[fmt::format("{}_mb_s", k)] = bytes / c[fmt::format("{}_s", k)].get<double>() / 1e6;
    fmt::print(stderr, "[tdc] world {}: save {:.0f} MB/s, load {:.0f} MB/s (warm {:.0f})\n", world,
               c["save_mb_s"].get<double>(), c["load_mb_s"].get<double>(), c["load_warm_mb_s"].get<double>());
    cases[std::to_string(world)] = c;
  }

  json tensors = json::array();
  for (const auto& t : lay) tensors.push_back({t.key, t.shape});
  json out = {
      {"cases", cases},
      {"dd", dd},
      {"disk", disk},
      {"state_dict",
       {{"tensors", tensors},
        {"dtype", "float32"},
        {"total_bytes", bytes},
        {"mb_requested", extra.mb},
        {"layout", "DTensor Shard(0) over a 1-D mesh of the world, FSDP2's rows (ceil(rows / world) per rank)"}}},
      {"world_sizes", args.worlds},
      {"repeat", repeat},
      {"timing",
       "each call from the end of a barrier to its return, slowest rank (all-reduce MAX); best over repeats; MB = "
       "10^6 bytes of tensor data"},
      {"load_cache",
       "load: the checkpoint's files dropped from the page cache first (fsync + posix_fadvise DONTNEED; "
       "resident_before_cold_load measured with mincore); load_warm: the same files again, cached"},
      {"launcher", "fork"},
      {"threads_per_rank", 1},
      {"load_average", {{"start", load_start}, {"end", load_average()}}},
  };
  out.update(tdc::bench::run_info(started_at, bench_start));
  if (!tdc::bench::write_result("tdc_bench checkpoint", args.out, out)) return 1;
  fmt::print(stderr, "-> {}\n", args.out);
  return 0;
}

}  // namespace bench_checkpoint
