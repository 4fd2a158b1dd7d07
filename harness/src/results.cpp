// The results model and its one writer: RunResults <-> JSON (docs/results-schema.md), JUnit XML,
// expectations. Used by every test binary (at the end of its run) and by `tdc run` (merging).
#include "tdc/harness/results.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <tdc/json/reader.h>

namespace tdc::harness {

using nlohmann::json;
namespace fs = std::filesystem;

// ------------------------------------------------------------------ statuses

namespace {
constexpr std::pair<Status, const char*> kStatusNames[] = {
    {Status::Pass, "PASS"},       {Status::Fail, "FAIL"},
    {Status::Skip, "SKIP"},       {Status::NotSupported, "NOT_SUPPORTED"},
    {Status::XFail, "XFAIL"},     {Status::XPass, "XPASS"},
    {Status::Timeout, "TIMEOUT"}, {Status::Crash, "CRASH"},
    {Status::Flaky, "FLAKY"},
};
constexpr int kSchemaVersion = 1;
}  // namespace

const char* to_string(Status s) {
  for (const auto& [status, name] : kStatusNames)
    if (status == s) return name;
  return "UNKNOWN";
}

Status status_from_string(const std::string& s) {
  for (const auto& [status, name] : kStatusNames)
    if (s == name) return status;
  throw std::invalid_argument(
      fmt::format("unknown test status '{}' (expected one of PASS, FAIL, SKIP, NOT_SUPPORTED, XFAIL, XPASS, "
                  "TIMEOUT, CRASH, FLAKY)",
                  s));
}

namespace {
constexpr std::pair<RankStatus, const char*> kRankStatusNames[] = {
    {RankStatus::Pass, "pass"},       {RankStatus::Fail, "fail"},       {RankStatus::Skip, "skip"},
    {RankStatus::Crash, "crash"},     {RankStatus::Timeout, "timeout"}, {RankStatus::Aborted, "aborted"},
    {RankStatus::Unknown, "unknown"},
};
}  // namespace

const char* to_string(RankStatus s) {
  for (const auto& [status, name] : kRankStatusNames)
    if (status == s) return name;
  return "unknown";
}

RankStatus rank_status_from_string(const std::string& s) {
  for (const auto& [status, name] : kRankStatusNames)
    if (s == name) return status;
  throw std::invalid_argument(
      fmt::format("unknown rank status '{}' (expected one of pass, fail, skip, crash, timeout, aborted, unknown)", s));
}

bool is_failure(Status s) {
  return s == Status::Fail || s == Status::XPass || s == Status::Timeout || s == Status::Crash || s == Status::Flaky;
}

std::map<Status, int> RunResults::counts() const {
  std::map<Status, int> c;
  for (const auto& [status, name] : kStatusNames) c[status] = 0;
  for (const auto& t : tests) ++c[t.status];
  return c;
}

bool RunResults::ok() const {
  for (const auto& t : tests)
    if (is_failure(t.status)) return false;
  return true;
}

// ------------------------------------------------------------------ JSON

namespace {
json run_info_json(const RunInfo& i) {
  json run_info = {
      {"implementation", i.implementation},
      {"implementation_version", i.implementation_version},
      {"implementation_library", i.implementation_library},
      {"backend", i.backend},
      {"device", i.device},
      {"world_size", i.world_size},
      {"launcher", i.launcher},
      {"suite_revision", i.suite_revision},
      {"tdc_version", i.tdc_version},
      {"libtorch_version", i.libtorch_version},
      {"libtorch_cuda", i.libtorch_cuda},
      {"nccl_version", i.nccl_version},
      {"compiler", i.compiler},
      {"host", i.host},
      {"started_at", i.started_at},
      {"duration_s", i.duration_s},
  };
  if (i.user_s > 0 || i.system_s > 0) {
    run_info["user_s"] = i.user_s;
    run_info["system_s"] = i.system_s;
  }
  return run_info;
}
}  // namespace

nlohmann::json to_json(const RunResults& r) {
  json run_info = run_info_json(r.run_info);
  json tests = json::array();
  for (const TestResult& t : r.tests) {
    json ranks = json::array();
    for (const RankDetail& d : t.ranks) {
      json jd = {
          {"rank", d.rank}, {"status", to_string(d.status)}, {"message", d.message}, {"duration_s", d.duration_s}};
      if (d.exit_code) jd["exit_code"] = *d.exit_code;
      if (d.signal) jd["signal"] = *d.signal;
      ranks.push_back(std::move(jd));
    }
    json jt = {{"id", t.id},
               {"suite", t.suite},
               {"name", t.name},
               {"status", to_string(t.status)},
               {"duration_s", t.duration_s},
               {"message", t.message},
               {"world_size", t.world_size},
               {"launcher", t.launcher},
               {"ranks", std::move(ranks)}};
    if (!t.expectation.empty()) jt["expectation"] = t.expectation;
    if (!t.file.empty()) jt["file"] = t.file, jt["line"] = t.line;
    if (!t.repeat_statuses.empty()) jt["repeat_statuses"] = t.repeat_statuses;
    if (!t.reports.empty()) jt["reports"] = t.reports;
    tests.push_back(std::move(jt));
  }
  // The summary is derived from "tests"; readers recompute it and ignore this copy.
  json summary = json::object();
  for (const auto& [status, n] : r.counts()) summary[to_string(status)] = n;
  summary["total"] = r.tests.size();
  summary["ok"] = r.ok();
  json out = {{"schema_version", r.schema_version},
              {"run_info", std::move(run_info)},
              {"summary", std::move(summary)},
              {"tests", std::move(tests)}};
  if (!r.reports.empty()) out["reports"] = r.reports;
  return out;
}

namespace {

using Reader = tdc::json::Reader<std::runtime_error>;

// JSON text must be valid UTF-8; test output is not always (a rank can print anything).
std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace); }

}  // namespace

void merge_reports(Reports& into, const Reports& from) {
  for (const auto& [name, report] : from)
    for (const auto& [key, values] : report) into[name][key].insert(values.begin(), values.end());
}

namespace {
// "reports": {NAME: {KEY: [VALUE, ...]}} ([Note: rank reports]), the object field `key` of `r`.
Reports reports_from_json(Reader& r, const std::string& key) {
  Reports out;
  Reader all = r.object(key);
  for (const auto& [name, report] : r.need(key).items()) {
    Reader one = all.object(name);
    for (const auto& [k, values] : report.items()) {
      for (std::string& v : one.strings(k)) out[name][k].insert(std::move(v));
    }
  }
  return out;
}
}  // namespace

namespace {

RunInfo run_info_from_json(Reader ri) {
  RunInfo i;
  i.implementation = ri.string("implementation");
  i.implementation_version = ri.string_or("implementation_version", "");
  i.implementation_library = ri.string_or("implementation_library", "");
  i.backend = ri.string("backend");
  i.device = ri.string("device");
  i.world_size = static_cast<int>(ri.integer("world_size", 0, std::numeric_limits<int>::max()));
  i.launcher = ri.string("launcher");
  i.suite_revision = ri.string_or("suite_revision", "");
  i.tdc_version = ri.string_or("tdc_version", "");
  i.libtorch_version = ri.string_or("libtorch_version", "");
  i.libtorch_cuda = ri.string_or("libtorch_cuda", "");
  i.nccl_version = ri.string_or("nccl_version", "");
  i.compiler = ri.string_or("compiler", "");
  i.host = ri.string_or("host", "");
  i.started_at = ri.string_or("started_at", "");
  i.duration_s = ri.number_or("duration_s", 0);
  i.user_s = ri.number_or("user_s", 0);
  i.system_s = ri.number_or("system_s", 0);
  return i;
}

// A status name of `kind` (status_from_string, rank_status_from_string) at the field `key` of `r`.
template <class Parse>
auto status_field(Reader& r, const std::string& key, Parse parse) {
  const json& v = r.need(key);
  const std::string name = r.string(key);
  try {
    return parse(name);
  } catch (const std::invalid_argument& e) {
    r.fail_at(r.field(key), e.what(), v);
  }
}

RankDetail rank_detail_from_json(Reader rd) {
  RankDetail d;
  d.rank = static_cast<int>(rd.integer("rank", 0, std::numeric_limits<int>::max()));
  d.status = status_field(rd, "status", rank_status_from_string);
  d.message = rd.string_or("message", "");
  d.duration_s = rd.number_or("duration_s", 0);
  auto small = [&](const char* key) -> std::optional<int> {
    if (auto v = rd.opt_integer(key, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()))
      return static_cast<int>(*v);
    return std::nullopt;
  };
  d.exit_code = small("exit_code");
  d.signal = small("signal");
  return d;
}

TestResult test_from_json(Reader rt) {
  TestResult t;
  t.id = rt.string("id");
  t.suite = rt.string("suite");
  t.name = rt.string("name");
  t.status = status_field(rt, "status", status_from_string);
  t.duration_s = rt.number("duration_s");
  t.message = rt.string_or("message", "");
  t.world_size = static_cast<int>(rt.integer_or("world_size", 0, 0, std::numeric_limits<int>::max()));
  t.launcher = rt.string_or("launcher", "");
  t.expectation = rt.string_or("expectation", "");
  t.file = rt.string_or("file", "");
  t.line = static_cast<int>(rt.integer_or("line", 0, 0, std::numeric_limits<int>::max()));
  if (rt.has("repeat_statuses")) {
    Reader rs = rt.object("repeat_statuses");
    for (const auto& [name, count] : rt.need("repeat_statuses").items()) {
      try {
        status_from_string(name);
      } catch (const std::invalid_argument& e) {
        rs.fail_at(rs.field(name), e.what(), count);
      }
      t.repeat_statuses[name] = static_cast<int>(rs.integer(name, 0, std::numeric_limits<int>::max()));
    }
  }
  const json& ranks = rt.array_or_empty("ranks");
  for (size_t n = 0; n < ranks.size(); ++n) t.ranks.push_back(rank_detail_from_json(rt.object_at("ranks", ranks, n)));
  if (rt.has("reports")) t.reports = reports_from_json(rt, "reports");
  return t;
}

}  // namespace

RunResults results_from_json(const nlohmann::json& j, const std::string& document) {
  Reader top(j, document);
  RunResults r;
  r.schema_version = static_cast<int>(top.integer("schema_version"));
  if (r.schema_version != kSchemaVersion)
    top.fail_at(
        "schema_version",
        fmt::format("is not supported (this tdc reads schema_version {}; see docs/results-schema.md)", kSchemaVersion),
        j["schema_version"]);
  r.run_info = run_info_from_json(top.object("run_info"));
  const json& tests = top.array("tests");
  r.tests.reserve(tests.size());
  for (size_t k = 0; k < tests.size(); ++k) r.tests.push_back(test_from_json(top.object_at("tests", tests, k)));
  if (top.has("reports")) r.reports = reports_from_json(top, "reports");
  for (const TestResult& t : r.tests) merge_reports(r.reports, t.reports);
  return r;
}

RunResults read_results(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in)
    throw std::runtime_error(fmt::format("results file '{}': cannot open: {}", p.string(), std::strerror(errno)));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(fmt::format("results file '{}': not valid JSON: {}", p.string(), e.what()));
  }
  return results_from_json(j, fmt::format("results file '{}'", p.string()));
}

// ------------------------------------------------------------------ atomic file write

namespace {

// Writes `text` to a temp file next to p, fsyncs it and renames it over p: readers see the old
// file or the new one, never a torn one. Creates p's directory.
void write_file_atomic(const fs::path& p, const std::string& text) {
  std::error_code ec;
  fs::path dir = p.parent_path();
  if (!dir.empty()) {
    fs::create_directories(dir, ec);
    if (ec)
      throw std::runtime_error(
          fmt::format("cannot create directory '{}' for '{}': {}", dir.string(), p.filename().string(), ec.message()));
  }
  std::random_device rd;
  fs::path tmp = p;
  tmp += fmt::format(".tmp.{}.{:08x}", ::getpid(), rd());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot create '{}': {}", tmp.string(), std::strerror(errno)));
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("{} '{}': {}", what, tmp.string(), std::strerror(err)));
  };
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write");
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) fail("cannot fsync");
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(fmt::format("cannot close '{}': {}", tmp.string(), std::strerror(err)));
  }
  if (::rename(tmp.c_str(), p.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw std::runtime_error(
        fmt::format("cannot rename '{}' to '{}': {}", tmp.string(), p.string(), std::strerror(err)));
  }
}

}  // namespace

void write_results_json(const RunResults& r, const fs::path& p) { write_file_atomic(p, dump(to_json(r)) + "\n"); }

// ------------------------------------------------------------------ JUnit XML

namespace {

// One ASCII byte as XML text: markup characters escaped; in attributes whitespace too (or a
// parser normalises it to spaces); control characters XML 1.0 cannot carry as a visible escape.
void append_xml_ascii(std::string& out, unsigned char c, bool attribute) {
  switch (c) {
    case '&':
      out += "&amp;";
      break;
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '"':
      out += "&quot;";
      break;
    case '\'':
      out += "&apos;";
      break;
    case '\n':
      out += attribute ? "&#10;" : "\n";
      break;
    case '\t':
      out += attribute ? "&#9;" : "\t";
      break;
    case '\r':
      out += "&#13;";
      break;
    default:
      if (c < 0x20 || c == 0x7f)
        out += fmt::format("\\x{:02x}", c);  // not representable in XML 1.0
      else
        out += static_cast<char>(c);
  }
}

// Appends s to out as XML character data / attribute text: escapes markup characters, replaces
// bytes XML 1.0 cannot carry (control characters, invalid UTF-8) with U+FFFD or a visible escape.
void append_xml_escaped(std::string& out, const std::string& s, bool attribute) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = b[i];
    if (c < 0x80) {
      append_xml_ascii(out, c, attribute);
      ++i;
      continue;
    }
    // Multi-byte UTF-8: validate length, continuation bytes, overlongs and surrogates.
    size_t len = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool valid = len != 0 && i + len <= n;
    uint32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; valid && k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80) valid = false;
      cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    if (valid) {
      static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      valid = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) && cp != 0xFFFE && cp != 0xFFFF;
    }
    if (valid) {
      out.append(s, i, len);
      i += len;
    } else {
      out += kReplacement;
      ++i;
    }
  }
}

}  // namespace

std::string xml_escape(const std::string& s, bool attribute) {
  std::string out;
  out.reserve(s.size() + 16);
  append_xml_escaped(out, s, attribute);
  return out;
}

namespace {

std::string xml(const std::string& s, bool attribute = true) { return xml_escape(s, attribute); }

std::string seconds(double s) { return fmt::format("{:.3f}", s); }

// First line of a message, for the "message" attribute (the full text goes in the element).
std::string first_line(const std::string& s) {
  size_t nl = s.find('\n');
  std::string line = nl == std::string::npos ? s : s.substr(0, nl);
  if (line.size() > 500) line = line.substr(0, 500) + "...";
  return line;
}

void append_testcase(std::string& out, const TestResult& t) {
  out += fmt::format("    <testcase name=\"{}\" classname=\"{}\" time=\"{}\" status=\"{}\"", xml(t.name), xml(t.suite),
                     seconds(t.duration_s), to_string(t.status));
  std::string body;
  std::string message = t.message;
  if (!t.expectation.empty()) message += (message.empty() ? "" : "\n") + ("expectation: " + t.expectation);
  switch (t.status) {
    case Status::Pass:
      break;
    case Status::Fail:
    case Status::XPass:
    case Status::Flaky:
      body = fmt::format("      <failure message=\"{}\" type=\"{}\">{}</failure>\n", xml(first_line(message)),
                         to_string(t.status), xml(message, false));
      break;
    case Status::Timeout:
    case Status::Crash:
      body = fmt::format("      <error message=\"{}\" type=\"{}\">{}</error>\n", xml(first_line(message)),
                         to_string(t.status), xml(message, false));
      break;
    case Status::Skip:
    case Status::NotSupported:
    case Status::XFail:
      body = fmt::format("      <skipped message=\"{}: {}\"/>\n", to_string(t.status), xml(first_line(message)));
      break;
  }
  if (body.empty()) {
    out += "/>\n";
  } else {
    out += ">\n" + body + "    </testcase>\n";
  }
}

struct Tally {
  int tests = 0, failures = 0, errors = 0, skipped = 0;
  double time = 0;
  void add(const TestResult& t) {
    ++tests;
    time += t.duration_s;
    switch (t.status) {
      case Status::Fail:
      case Status::XPass:
      case Status::Flaky:
        ++failures;
        break;
      case Status::Timeout:
      case Status::Crash:
        ++errors;
        break;
      case Status::Skip:
      case Status::NotSupported:
      case Status::XFail:
        ++skipped;
        break;
      case Status::Pass:
        break;
    }
  }
  std::string attrs() const {
    return fmt::format("tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{}\"", tests, failures, errors,
                       skipped, seconds(time));
  }
};

}  // namespace

void write_junit_xml(const RunResults& r, const fs::path& p) {
  // Group by suite, keeping the order in which suites first appear.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const TestResult*>> by_suite;
  for (const TestResult& t : r.tests) {
    auto [it, inserted] = by_suite.try_emplace(t.suite);
    if (inserted) order.push_back(t.suite);
    it->second.push_back(&t);
  }
  Tally all;
  for (const TestResult& t : r.tests) all.add(t);

  const RunInfo& i = r.run_info;
  std::string props;
  for (const auto& [k, v] :
       std::initializer_list<std::pair<const char*, std::string>>{{"implementation", i.implementation},
                                                                  {"implementation_version", i.implementation_version},
                                                                  {"implementation_library", i.implementation_library},
                                                                  {"backend", i.backend},
                                                                  {"device", i.device},
                                                                  {"world_size", std::to_string(i.world_size)},
                                                                  {"launcher", i.launcher},
                                                                  {"suite_revision", i.suite_revision},
                                                                  {"tdc_version", i.tdc_version},
                                                                  {"libtorch_version", i.libtorch_version},
                                                                  {"libtorch_cuda", i.libtorch_cuda},
                                                                  {"nccl_version", i.nccl_version},
                                                                  {"compiler", i.compiler}}) {
    props += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", k, xml(v));
  }

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format("<testsuites name=\"tdc\" {} timestamp=\"{}\">\n", all.attrs(), xml(i.started_at));
  for (const std::string& suite : order) {
    Tally s;
    for (const TestResult* t : by_suite[suite]) s.add(*t);
    out += fmt::format("  <testsuite name=\"{}\" {} timestamp=\"{}\" hostname=\"{}\">\n", xml(suite), s.attrs(),
                       xml(i.started_at), xml(i.host));
    out += "    <properties>\n" + props + "    </properties>\n";
    for (const TestResult* t : by_suite[suite]) append_testcase(out, *t);
    out += "  </testsuite>\n";
  }
  out += "</testsuites>\n";
  write_file_atomic(p, out);
}

// ------------------------------------------------------------------ expectations

Expectations read_expectations(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in)
    throw std::runtime_error(fmt::format("expectations file '{}': cannot open: {}", p.string(), std::strerror(errno)));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(fmt::format("expectations file '{}': not valid JSON: {}", p.string(), e.what()));
  }
  Reader top(j, fmt::format("expectations file '{}'", p.string()));
  Reader tests = top.object("tests");
  Expectations e;
  for (const auto& [id, value] : top.need("tests").items()) {
    Reader rt = tests.object(id);
    Expectation x;
    x.status = status_field(rt, "status", status_from_string);
    x.reason = rt.string_or("reason", "");
    e.emplace(id, std::move(x));
  }
  return e;
}

void apply_expectations(TestResult& t, const Expectations& e) {
  if (t.status == Status::Flaky) return;  // flakes are found, not hidden: no expectation covers one
  // Exact id first; otherwise the first glob key ("Suite.*") that matches.
  const Expectation* x = nullptr;
  if (auto it = e.find(t.id); it != e.end()) {
    x = &it->second;
  } else {
    for (const auto& [pattern, value] : e) {
      if (pattern.find_first_of("*?[") != std::string::npos && ::fnmatch(pattern.c_str(), t.id.c_str(), 0) == 0) {
        x = &value;
        break;
      }
    }
  }
  if (!x) return;
  std::string reason = x->reason.empty() ? "(no reason given)" : x->reason;
  t.expectation = fmt::format("expected {}: {}", to_string(x->status), reason);
  // Only an expected failure changes the status; other expectations are recorded, not applied.
  if (!is_failure(x->status) || x->status == Status::XPass) return;
  if (is_failure(t.status) && t.status != Status::XPass) {
    std::string was = fmt::format("[{}] {}", to_string(t.status), t.message);
    t.status = Status::XFail;
    t.message = was;
  } else if (t.status == Status::Pass) {
    t.status = Status::XPass;
    t.message = fmt::format("passed, but expected {}: {}", to_string(x->status), reason);
  }
}

// ------------------------------------------------------------------ host facts

std::string iso_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace tdc::harness
