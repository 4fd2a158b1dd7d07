// tdc's one reader of JSON documents: typed field access whose errors name the document, the
// field's path and the value found ([Note: one JSON reader]).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace tdc::json {

// [Note: one JSON reader] Every JSON file tdc reads (results.json, parity scenarios and results,
// the mutant catalogue, traces, to_bytes headers) is read through Reader, so every such error
// reads the same way and a user can act on it:
//   <document>: missing field '<path>'
//   <document>: field '<path>': <what it must be> (value: <what was found>)
//   <document>: <what it must be> (value: ...)            (the document's top level)
// <document> names the file ("scenario 'a.json'", "results.json '/tmp/r/results.json'");
// <path> is the field's path from the top ("tests[3].status", "mesh.shape"). A value is shown
// compact, cut at 80 characters, and never throws (invalid UTF-8 is replaced). Each reader
// throws its caller's error type (Error), so the callers' contracts stay as they were.
// Optional fields: absent and null mean "not given". A Reader only reads; it remembers which
// keys were read so that no_unknown_keys() can refuse typos. Semantic checks beyond the type
// (a shape that does not match a mesh, say) go through fail() so that they read the same way.
// The Reader refers to the JSON value and strings it was given: they must outlive it.

// A JSON value in a message: compact, bounded, never throwing.
inline std::string shown(const nlohmann::json& v, size_t max_chars = 80) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return s.size() > max_chars ? s.substr(0, max_chars) + "..." : s;
}

template <class Error = std::runtime_error>
class Reader {
 public:
  using json = nlohmann::json;

  // `value` must be a JSON object.
  Reader(const json& value, std::string document, std::string path = "")
      : j_(value), document_(std::move(document)), path_(std::move(path)) {
    if (!j_.is_object()) fail("must be a JSON object", j_);
  }

  const std::string& document() const { return document_; }
  const std::string& path() const { return path_; }
  // The path of a field of this object ("mesh.shape"), or of an element ("tests[3]").
  std::string field(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  std::string element(const std::string& key, size_t i) const { return fmt::format("{}[{}]", field(key), i); }

  // ------------------------------------------------------------ errors
  // This object's own problem ("has shape [2] but 3 ranks"), or a field's.
  [[noreturn]] void fail(const std::string& what, const json& value) const { fail_at(path_, what, value); }
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(path_.empty() ? fmt::format("{}: {}", document_, what)
                              : fmt::format("{}: field '{}': {}", document_, path_, what));
  }
  [[noreturn]] void fail_at(const std::string& path, const std::string& what, const json& value) const {
    throw Error(path.empty() ? fmt::format("{}: {} (value: {})", document_, what, shown(value))
                             : fmt::format("{}: field '{}': {} (value: {})", document_, path, what, shown(value)));
  }

  // ------------------------------------------------------------ presence
  bool has(const std::string& key) { return find(key) != nullptr; }
  // The field's value, or the missing-field error.
  const json& need(const std::string& key) {
    const json* v = find(key);
    if (!v) throw Error(fmt::format("{}: missing field '{}'", document_, field(key)));
    return *v;
  }
  // The field's value, or nullptr when absent or null.
  const json* find(const std::string& key) {
    seen_.insert(key);
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  // ------------------------------------------------------------ strings
  // A string; with `allowed`, one of those; without, not empty unless `may_be_empty`.
  std::string string(const std::string& key, const std::vector<std::string>& allowed = {}, bool may_be_empty = false) {
    return string_value(field(key), need(key), allowed, may_be_empty);
  }
  std::string string_or(const std::string& key, const std::string& dflt, const std::vector<std::string>& allowed = {}) {
    const json* v = find(key);
    return v ? string_value(field(key), *v, allowed, true) : dflt;
  }
  std::vector<std::string> strings(const std::string& key) {
    const json& a = array(key, "must be a list of strings");
    std::vector<std::string> out;
    for (size_t i = 0; i < a.size(); ++i) out.push_back(string_value(element(key, i), a[i], {}, true));
    return out;
  }

  // ------------------------------------------------------------ numbers
  // An integer in [lo, hi] (unsigned JSON numbers above int64's range are out of range).
  int64_t integer(const std::string& key, int64_t lo = std::numeric_limits<int64_t>::min(),
                  int64_t hi = std::numeric_limits<int64_t>::max()) {
    return integer_value(field(key), need(key), lo, hi);
  }
  int64_t integer_or(const std::string& key, int64_t dflt, int64_t lo = std::numeric_limits<int64_t>::min(),
                     int64_t hi = std::numeric_limits<int64_t>::max()) {
    const json* v = find(key);
    return v ? integer_value(field(key), *v, lo, hi) : dflt;
  }
  std::optional<int64_t> opt_integer(const std::string& key, int64_t lo = std::numeric_limits<int64_t>::min(),
                                     int64_t hi = std::numeric_limits<int64_t>::max()) {
    const json* v = find(key);
    if (!v) return std::nullopt;
    return integer_value(field(key), *v, lo, hi);
  }
  std::vector<int64_t> integers(const std::string& key, int64_t lo = std::numeric_limits<int64_t>::min(),
                                int64_t hi = std::numeric_limits<int64_t>::max()) {
    const json& a = array(key, "must be a list of integers");
    std::vector<int64_t> out;
    out.reserve(a.size());
    for (size_t i = 0; i < a.size(); ++i) out.push_back(integer_value(element(key, i), a[i], lo, hi));
    return out;
  }
  // A number (integer or float) >= lo.
  double number(const std::string& key, double lo = -std::numeric_limits<double>::infinity()) {
    return number_value(field(key), need(key), lo);
  }
  double number_or(const std::string& key, double dflt, double lo = -std::numeric_limits<double>::infinity()) {
    const json* v = find(key);
    return v ? number_value(field(key), *v, lo) : dflt;
  }

  // ------------------------------------------------------------ the rest
  bool boolean(const std::string& key) { return boolean_value(field(key), need(key)); }
  bool boolean_or(const std::string& key, bool dflt) {
    const json* v = find(key);
    return v ? boolean_value(field(key), *v) : dflt;
  }
  const json& array(const std::string& key, const std::string& what = "must be a list") {
    const json& v = need(key);
    if (!v.is_array()) fail_at(field(key), what, v);
    return v;
  }
  // An array that may be absent (then empty).
  const json& array_or_empty(const std::string& key, const std::string& what = "must be a list") {
    static const json kEmpty = json::array();
    const json* v = find(key);
    if (!v) return kEmpty;
    if (!v->is_array()) fail_at(field(key), what, *v);
    return *v;
  }
  Reader object(const std::string& key) { return Reader(need(key), document_, field(key)); }
  // An object that may be absent (then empty).
  Reader object_or_empty(const std::string& key) {
    static const json kEmpty = json::object();
    const json* v = find(key);
    return Reader(v ? *v : kEmpty, document_, field(key));
  }
  // Element i of the array field `key` (read by array()), as an object.
  Reader object_at(const std::string& key, const json& arr, size_t i) const {
    return Reader(arr[i], document_, element(key, i));
  }

  // Every key of the object must have been read.
  void no_unknown_keys() const {
    for (const auto& [key, value] : j_.items()) {
      if (!seen_.count(key)) fail_at(field(key), "unknown field", value);
    }
  }

  // ------------------------------------------------------------ values (an array's elements)
  std::string string_value(const std::string& path, const json& v, const std::vector<std::string>& allowed,
                           bool may_be_empty) const {
    if (!v.is_string()) fail_at(path, "must be a string", v);
    std::string s = v.get<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end())
      fail_at(path, fmt::format("unknown value (known: {})", fmt::join(allowed, ", ")), v);
    if (allowed.empty() && !may_be_empty && s.empty()) fail_at(path, "must not be empty", v);
    return s;
  }
  int64_t integer_value(const std::string& path, const json& v, int64_t lo, int64_t hi) const {
    const bool in_int64 =
        v.is_number_integer() &&
        (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (!in_int64 || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      if (lo == std::numeric_limits<int64_t>::min() && hi == std::numeric_limits<int64_t>::max())
        fail_at(path, "must be an integer", v);
      fail_at(path, fmt::format("must be an integer in {}..{}", lo, hi), v);
    }
    return v.get<int64_t>();
  }
  double number_value(const std::string& path, const json& v, double lo) const {
    if (!v.is_number()) fail_at(path, "must be a number", v);
    const double d = v.get<double>();
    if (!(d >= lo)) fail_at(path, fmt::format("must be >= {}", lo), v);
    return d;
  }
  bool boolean_value(const std::string& path, const json& v) const {
    if (!v.is_boolean()) fail_at(path, "must be true or false", v);
    return v.get<bool>();
  }

 private:
  const json& j_;
  std::string document_;
  std::string path_;
  std::set<std::string> seen_;
};

}  // namespace tdc::json
