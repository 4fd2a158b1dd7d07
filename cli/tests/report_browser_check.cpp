// tdc_report_browser_check (CTest tdc_report_browser_test): the report as a real browser shows it.
// 1. `tdc-cli report` on the fixture runs (cli/tests/fixtures/report: two runs with a FAIL whose
//    message holds markup, a FLAKY, regressions, new passes) plus the sample parity.json;
// 2. headless Chromium renders report.html to a PNG and dumps the DOM it built;
// 3. the checks below read that DOM: matrix and its run columns, per-class and seed counts, each
//    failing cell's link to an element holding its message (escaped, not executed) and log
//    excerpt, the diff's regressions and new passes, the flaky table, one loss chart per parity
//    scenario, no external resource; and the PNG: a valid PNG of the window's size with content.
// Chromium missing is a FAIL naming ./tdc, which installs it.
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "../process.h"
#include "dom_lite.h"

namespace fs = std::filesystem;
using namespace tdc::cli;

namespace {

constexpr int kWidth = 1400, kHeight = 2000;
constexpr double kCommandTimeoutS = 120;

int failures = 0;

void check(bool ok, const std::string& what) {
  fmt::print("{} {}\n", ok ? "ok:  " : "FAIL:", what);
  if (!ok) ++failures;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::optional<fs::path> find_chromium() {
  if (const char* env = std::getenv("TDC_CHROMIUM"); env && *env) return fs::path(env);
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (const char* name : {"chromium", "chromium-browser"}) {
    size_t start = 0;
    while (start <= dirs.size()) {
      size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      fs::path p = fs::path(dirs.substr(start, end - start)) / name;
      if (::access(p.c_str(), X_OK) == 0) return p;
      start = end + 1;
    }
  }
  return std::nullopt;
}

// [Note: running Chromium in a test] Headless, no sandbox (CI containers run as root), no GPU, a
// fresh profile in a temporary directory (removed after), nothing that phones home, a proxy that
// does not exist so that any network request the page made would fail, and a deadline.
class Chromium {
 public:
  explicit Chromium(fs::path exe) : exe_(std::move(exe)) {
    char tmpl[] = "/tmp/tdc-chromium-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
    profile_ = tmpl;
  }
  ~Chromium() {
    std::error_code ec;
    fs::remove_all(profile_, ec);
  }

  Captured run(const std::vector<std::string>& extra, const std::string& url) const {
    std::vector<std::string> argv = {exe_.string(),
                                     "--headless",
                                     "--no-sandbox",
                                     "--disable-gpu",
                                     "--no-first-run",
                                     "--no-default-browser-check",
                                     "--disable-extensions",
                                     "--disable-background-networking",
                                     "--disable-component-update",
                                     "--disable-sync",
                                     "--disable-default-apps",
                                     "--mute-audio",
                                     "--hide-scrollbars",
                                     "--proxy-server=127.0.0.1:9",
                                     "--user-data-dir=" + profile_.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(url);
    return capture(argv, false, kCommandTimeoutS);
  }

 private:
  fs::path exe_, profile_;
};

std::string status_of(const Captured& c) {
  return c.timed_out ? fmt::format("no answer within {:.0f} s", kCommandTimeoutS) : describe_exit(c.status);
}
bool succeeded(const Captured& c) { return !c.timed_out && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }

// ------------------------------------------------------------------ PNG

struct Png {
  bool valid = false;
  uint32_t width = 0, height = 0;
  uintmax_t bytes = 0;
};

Png read_png(const fs::path& p) {
  Png png;
  std::string data = read_file(p);
  png.bytes = data.size();
  static const unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (data.size() < 33 || std::memcmp(data.data(), kSignature, 8) != 0 || data.compare(12, 4, "IHDR") != 0) return png;
  auto be32 = [&](size_t at) {
    const auto* b = reinterpret_cast<const unsigned char*>(data.data() + at);
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | uint32_t(b[3]);
  };
  png.width = be32(16);
  png.height = be32(20);
  png.valid = data.size() >= 12 && data.compare(data.size() - 8, 4, "IEND") == 0;
  return png;
}

// ------------------------------------------------------------------ DOM checks

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

std::set<std::string> data_tests(const dom::Node& root, const std::string& selector) {
  std::set<std::string> out;
  for (const dom::Node* n : dom::select(root, selector))
    if (const std::string* t = n->attr("data-test")) out.insert(*t);
  return out;
}

std::string show(const std::set<std::string>& s) { return fmt::format("{{{}}}", fmt::join(s, ", ")); }

void check_runs_and_matrix(const dom::Node& doc) {
  const dom::Node* matrix = dom::select_one(doc, "table#matrix");
  check(matrix != nullptr, "table#matrix is in the DOM");
  if (!matrix) return;
  auto heads = dom::select(*matrix, "th.run");
  check(heads.size() == 2, fmt::format("the matrix has one column per run (2), found {}", heads.size()));
  if (heads.size() == 2) {
    auto a = [](const dom::Node* n, const char* k) { return n->attr(k) ? *n->attr(k) : std::string("(none)"); };
    check(a(heads[0], "data-implementation") == "tdc-reference" && a(heads[0], "data-launcher") == "fork" &&
              a(heads[1], "data-implementation") == "my-impl" && a(heads[1], "data-launcher") == "thread" &&
              a(heads[1], "data-backend") == "gloo" && a(heads[1], "data-device") == "cpu",
          fmt::format("run columns say implementation/backend/device/launcher: '{}' '{}', '{}' '{}'",
                      a(heads[0], "data-implementation"), a(heads[0], "data-launcher"),
                      a(heads[1], "data-implementation"), a(heads[1], "data-launcher")));
  }
  size_t seed_rows = dom::select(*matrix, "tr.test-row[data-seed=1]").size();
  check(seed_rows == 102, fmt::format("the matrix has the 102 seed rows, found {}", seed_rows));
  const dom::Node* total = dom::select_one(doc, "#seed-total");
  check(total && total->attr("data-count") && *total->attr("data-count") == "102" &&
            trimmed(total->text_content()) == "102",
        fmt::format("#seed-total shows 102 (found '{}')", total ? trimmed(total->text_content()) : "no element"));

  // Per-class and per-run seed counts, as the fixture README lists them.
  std::map<std::string, std::vector<std::string>> want = {
      {"TestFullyShard2DTraining", {"2/4", "2/4"}},
      {"ComposabilityTestCUDA", {"1/13", "0/13"}},
      {"TestFullyShardAllGatherExtensionsMultiProcess", {"1/1", "0/1"}},
      {"TestFullyShardWithDistributedStateDict", {"0/6", "1/6"}},
      {"TestParityWithDDPCUDA", {"0/48", "0/48"}}};
  for (const auto& [cls, counts] : want)
    for (size_t r = 0; r < counts.size(); ++r) {
      const dom::Node* td =
          dom::select_one(*matrix, fmt::format("tr.class-row[data-class={}] td.count[data-run={}]", cls, r));
      std::string got = td ? trimmed(td->text_content()) : "no cell";
      check(got == counts[r], fmt::format("class {} run {}: {} passes (found '{}')", cls, r + 1, counts[r], got));
    }
  for (auto [run, want_pass] : std::vector<std::pair<int, std::string>>{{0, "4"}, {1, "3"}}) {
    const dom::Node* n = dom::select_one(doc, fmt::format(".seed-pass[data-run={}]", run));
    std::string got = n ? trimmed(n->text_content()) : "no element";
    check(got == want_pass, fmt::format("run {}: {} of the seed tests pass (found '{}')", run + 1, want_pass, got));
  }
  // The CPU run's composability result fills the CUDA row.
  const dom::Node* comp = dom::select_one(
      *matrix, "tr.test-row[data-test=ComposabilityTestCUDA.test_pp_ddp_ScheduleClass0_cuda] td.cell[data-run=1]");
  check(comp && comp->attr("data-status") && *comp->attr("data-status") == "TIMEOUT",
        "ComposabilityTestCPU..._cpu is shown in the ComposabilityTestCUDA..._cuda row (TIMEOUT in run 2)");
  size_t not_impl = dom::select(*matrix, "td.cell[data-run=0][data-status=NOT_IMPLEMENTED]").size();
  check(not_impl == 96, fmt::format("run 1: 96 seed rows not implemented, found {}", not_impl));
}

void check_failing_cell(const dom::Node& doc, const std::string& fixture_message) {
  const std::string id = "TestFullyShard2DTraining.test_train_parity_2d_transformer";
  const dom::Node* cell = dom::select_one(
      doc, fmt::format("table#matrix tr.test-row[data-test={}] td.cell[data-run=1][data-status=FAIL]", id));
  check(cell != nullptr, "the regression's cell is FAIL in run 2");
  const dom::Node* link = cell ? dom::select_one(*cell, "a[href]") : nullptr;
  check(link != nullptr, "the failing cell is a link");
  if (!link) return;
  std::string href = *link->attr("href");
  check(href.size() > 1 && href[0] == '#', fmt::format("the link points into the page ({})", href));
  const dom::Node* block = dom::select_one(doc, href);
  check(block != nullptr, fmt::format("element {} exists", href));
  if (!block) return;
  check(block->attr("data-test") && *block->attr("data-test") == id, "it is that test's message block");
  const dom::Node* msg = dom::select_one(*block, "pre.message");
  check(msg && msg->text_content() == fixture_message,
        "it holds the message exactly as results.json has it (markup shown as text)");
  check(dom::select(*block, "script").empty(), "the message's <script> did not become an element");
  const dom::Node* log = dom::select_one(*block, "pre.log-excerpt");
  check(
      log && log->text_content().find("step 3 losses: tdc 0.512 pytorch 0.498 (fixture log line)") != std::string::npos,
      "it holds the log excerpt from run_b/logs");
  const dom::Node* title = dom::select_one(doc, "title");
  check(title && title->text_content() == "tdc report", "no script from a message ran (the title is unchanged)");
  // Every non-PASS result cell links to an existing element.
  int cells = 0, broken = 0;
  for (const dom::Node* td : dom::select(doc, "table#matrix td.cell")) {
    const std::string* st = td->attr("data-status");
    if (!st || *st == "PASS" || *st == "NOT_IMPLEMENTED" || *st == "NOT_RUN") continue;
    ++cells;
    const dom::Node* a = dom::select_one(*td, "a[href]");
    if (!a || !dom::select_one(doc, *a->attr("href"))) ++broken;
  }
  check(cells == 5 && broken == 0,
        fmt::format("all {} non-PASS cells (5 expected) link to their message ({} broken)", cells, broken));
}

void check_diff_and_flaky(const dom::Node& doc) {
  std::set<std::string> regressions = data_tests(doc, "#diff ul#regressions li");
  std::set<std::string> want = {"TestFullyShard2DTraining.test_train_parity_2d_transformer",
                                "TestFullyShardAllGatherExtensionsMultiProcess.test_all_gather_extensions_train_parity",
                                "ComposabilityTestCUDA.test_pp_ddp_ScheduleClass0_cuda"};
  check(regressions == want, fmt::format("the diff lists the 3 regressions: {}", show(regressions)));
  std::set<std::string> passes = data_tests(doc, "#diff ul#new-passes li");
  check(passes == std::set<std::string>{"TestFullyShard2DTraining.test_tp_with_fsdp_offloading",
                                        "TestFullyShardWithDistributedStateDict.test_1d_fsdp_get_model_state_dict"},
        fmt::format("the diff lists the 2 new passes: {}", show(passes)));
  std::set<std::string> changes = data_tests(doc, "#diff table#status-changes tr");
  check(changes == std::set<std::string>{"HarnessBasics.TwoRanks"},
        fmt::format("the other status change is HarnessBasics.TwoRanks: {}", show(changes)));
  auto flaky = dom::select(doc, "table#flaky-table tr.flaky");
  check(flaky.size() == 1 && *flaky[0]->attr("data-run") == "1" &&
            *flaky[0]->attr("data-test") ==
                "TestFullyShardAllGatherExtensionsMultiProcess.test_all_gather_extensions_train_parity" &&
            flaky[0]->text_content().find("FAIL \u00d71, PASS \u00d72") != std::string::npos,
        fmt::format("the flaky table has run 2's test with FAIL ×1, PASS ×2 ({} rows)", flaky.size()));
}

void check_parity(const dom::Node& doc, const fs::path& parity_json) {
  // The scenario names, from the fixture itself.
  std::string text = read_file(parity_json);
  std::vector<std::string> names;
  for (size_t at = text.find("\"name\": \""); at != std::string::npos; at = text.find("\"name\": \"", at + 1)) {
    size_t b = at + 9;
    names.push_back(text.substr(b, text.find('"', b) - b));
  }
  check(names.size() == 2, fmt::format("the sample parity.json has 2 scenarios ({})", names.size()));
  for (const std::string& name : names) {
    const dom::Node* sc = dom::select_one(doc, fmt::format("#parity .scenario[data-scenario={}]", name));
    check(sc != nullptr, fmt::format("parity scenario {} is shown", name));
    if (!sc) continue;
    const dom::Node* svg = dom::select_one(*sc, "svg.loss-chart");
    auto lines = svg ? dom::select(*svg, "polyline.series") : std::vector<const dom::Node*>{};
    bool five = lines.size() == 2;
    for (const dom::Node* l : lines) five &= l->attr("data-points") && *l->attr("data-points") == "5";
    check(svg && five && dom::select_one(*svg, "polyline.tdc") && dom::select_one(*svg, "polyline.pytorch"),
          fmt::format("{}: an SVG loss chart with the tdc and PyTorch curves of 5 steps each", name));
    size_t steps = dom::select(*sc, "table.per-step tr[data-step]").size();
    check(steps == 5, fmt::format("{}: the per-step table has 5 steps ({})", name, steps));
  }
  const dom::Node* failing = dom::select_one(doc, "#parity .scenario[data-scenario=fsdp2_tp_mlp]");
  check(failing && failing->attr("data-verdict") && *failing->attr("data-verdict") == "FAIL",
        "fsdp2_tp_mlp's verdict FAIL is shown");
}

void check_self_contained(const dom::Node& doc) {
  std::vector<std::string> external;
  std::vector<const dom::Node*> stack = {&doc};
  while (!stack.empty()) {
    const dom::Node* n = stack.back();
    stack.pop_back();
    for (const char* a : {"src", "href"})
      if (const std::string* v = n->attr(a); v && !v->empty() && (*v)[0] != '#' && v->rfind("data:", 0) != 0)
        external.push_back(n->tag + " " + a + "=" + *v);
    if (n->tag == "link") external.push_back("<link>");
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  check(external.empty(), fmt::format("no external resource ({})", fmt::join(external, ", ")));
  const dom::Node* body = dom::select_one(doc, "body");
  check(body && body->attr("data-js") && *body->attr("data-js") == "ready", "the page's own script ran without error");
}

struct Args {
  fs::path cli, fixtures, seed_table, out;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--cli")
      a.cli = v;
    else if (k == "--fixtures")
      a.fixtures = v;
    else if (k == "--seed-table")
      a.seed_table = v;
    else if (k == "--out")
      a.out = v;
    else
      throw std::runtime_error("unknown option " + k);
  }
  if (a.cli.empty() || a.fixtures.empty() || a.seed_table.empty() || a.out.empty())
    throw std::runtime_error(
        "usage: tdc_report_browser_check --cli TDC_CLI --fixtures DIR --seed-table FILE --out DIR");
  return a;
}

// 1. The report of the fixture runs; the path of report.html, or nullopt (failures counted).
std::optional<fs::path> generate_report(const Args& args) {
  Captured gen = capture(
      {args.cli.string(), "report", (args.fixtures / "run_a").string(),
       (args.fixtures / "run_b" / "results.json").string(), "--parity", (args.fixtures / "parity.json").string(),
       "--seed-table", args.seed_table.string(), "--out", args.out.string()},
      true, kCommandTimeoutS);
  check(succeeded(gen),
        fmt::format("tdc-cli report exits 0 ({}){}", status_of(gen), succeeded(gen) ? "" : ":\n" + gen.output));
  fs::path html = fs::absolute(args.out / "report.html");
  check(fs::is_regular_file(html) && fs::is_regular_file(args.out / "report.md"), "report.html and report.md written");
  if (failures) return std::nullopt;
  return html;
}

// 4. The PNG: the window's size, and content (compared with a blank page's screenshot).
void check_screenshot(const fs::path& png_path, const std::optional<fs::path>& blank_png) {
  Png png = read_png(png_path);
  check(png.valid, fmt::format("{} is a PNG (signature, IHDR, IEND)", png_path.string()));
  check(png.width == kWidth && png.height == kHeight,
        fmt::format("the screenshot is {}x{} (found {}x{})", kWidth, kHeight, png.width, png.height));
  Png base = blank_png ? read_png(*blank_png) : Png{};
  // [Note: what "non-trivial" means for the screenshot] PNG compresses flat colour to almost
  // nothing: a blank page of the same size is ~15 KB. The report's text, tables and charts make
  // it several times larger; 3x the blank page is far below what the report gives and far above
  // what an empty or error page gives, on any Chromium build.
  check(base.valid && png.bytes >= 3 * base.bytes,
        fmt::format("the screenshot has content: {} bytes, a blank page {} bytes (need 3x)", png.bytes, base.bytes));
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  try {
    args = parse(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  install_signal_handlers();
  std::optional<fs::path> chromium = find_chromium();
  if (!chromium) {
    fmt::print(
        "FAIL: chromium is not installed (no 'chromium' or 'chromium-browser' on PATH, no $TDC_CHROMIUM): ./tdc "
        "installs it (Debian package 'chromium'; by hand: apt-get install chromium)\n");
    return 1;
  }
  std::error_code ec;
  fs::remove_all(args.out, ec);
  fs::create_directories(args.out);
  const std::optional<fs::path> html = generate_report(args);
  if (!html) return 1;

  // 2. Chromium: the DOM it built, and a screenshot.
  Chromium browser(*chromium);
  std::string url = "file://" + html->string();
  Captured dump = browser.run({"--dump-dom"}, url);
  check(succeeded(dump) && dump.output.find("<html") != std::string::npos,
        fmt::format("chromium --dump-dom {} ({}, {} bytes)", url, status_of(dump), dump.output.size()));
  fs::path png_path = fs::absolute(args.out / "report.png");
  Captured shot = browser.run(
      {fmt::format("--screenshot={}", png_path.string()), fmt::format("--window-size={},{}", kWidth, kHeight)}, url);
  check(succeeded(shot), fmt::format("chromium --screenshot ({})", status_of(shot)));
  // A blank page's screenshot is the baseline for "the PNG has content".
  fs::path blank_html = fs::absolute(args.out / "blank.html"), blank_png = fs::absolute(args.out / "blank.png");
  std::ofstream(blank_html) << "<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body></body></html>\n";
  Captured blank = browser.run(
      {fmt::format("--screenshot={}", blank_png.string()), fmt::format("--window-size={},{}", kWidth, kHeight)},
      "file://" + blank_html.string());
  if (failures) return 1;
  std::ofstream(args.out / "report.dom.html") << dump.output;

  // 3. The DOM.
  std::unique_ptr<dom::Node> doc = dom::parse(dump.output);
  std::string fixture_message =
      "[rank 1] test_2d_composability.cpp:212: loss mismatch at step 3: <tdc> 0.512 & \"pytorch\" 0.498 "
      "</pre><script>document.title='pwned'</script>";
  check_runs_and_matrix(*doc);
  check_failing_cell(*doc, fixture_message);
  check_diff_and_flaky(*doc);
  check_parity(*doc, args.fixtures / "parity.json");
  check_self_contained(*doc);
  check_screenshot(png_path, succeeded(blank) ? std::optional<fs::path>(blank_png) : std::nullopt);

  fmt::print("\n{} check(s) failed; screenshot {}\n", failures, png_path.string());
  return failures ? 1 : 0;
}
