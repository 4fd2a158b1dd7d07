#include "tdc/harness/xml_check.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <vector>

#include <fmt/format.h>

namespace tdc::harness {

int XmlSummary::count(const std::string& name) const {
  return static_cast<int>(std::count(names.begin(), names.end(), name));
}

namespace {

struct XmlError {
  std::string message;
};

class Checker {
 public:
  explicit Checker(const std::string& s) : s_(s) {}

  void document(XmlSummary& out) {
    if (s_.compare(0, 3, "\xEF\xBB\xBF") == 0) i_ = 3;
    if (s_.compare(i_, 5, "<?xml") == 0) processing_instruction();
    misc();
    if (!peek('<')) fail("expected the root element");
    element(out);
    out.root = root_;
    misc();
    if (i_ != s_.size()) fail("content after the root element");
  }

  std::string where(size_t at) const {
    int line = 1, col = 1;
    for (size_t k = 0; k < at && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return fmt::format("line {}, column {}", line, col);
  }
  size_t pos() const { return i_; }

 private:
  [[noreturn]] void fail(const std::string& what) { throw XmlError{what}; }
  bool peek(char c) const { return i_ < s_.size() && s_[i_] == c; }
  bool starts(const char* t) const { return s_.compare(i_, std::char_traits<char>::length(t), t) == 0; }
  void expect(const char* t) {
    if (!starts(t)) fail(fmt::format("expected '{}'", t));
    i_ += std::char_traits<char>::length(t);
  }
  void spaces() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  static bool name_start(unsigned char c) { return std::isalpha(c) || c == '_' || c == ':' || c >= 0x80; }
  static bool name_char(unsigned char c) { return name_start(c) || std::isdigit(c) || c == '-' || c == '.'; }
  std::string name() {
    size_t start = i_;
    if (i_ >= s_.size() || !name_start(s_[i_])) fail("expected a name");
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    return s_.substr(start, i_ - start);
  }
  void character(unsigned char c) {
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
      fail(fmt::format("control character {:#04x} is not allowed in XML 1.0", c));
  }
  void reference() {
    expect("&");
    size_t semi = s_.find(';', i_);
    if (semi == std::string::npos || semi - i_ > 10) fail("unterminated entity reference");
    std::string ref = s_.substr(i_, semi - i_);
    static const std::set<std::string> kNamed = {"amp", "lt", "gt", "quot", "apos"};
    bool ok = kNamed.count(ref) != 0;
    if (!ok && ref.size() > 1 && ref[0] == '#') {
      bool hex = ref[1] == 'x';
      std::string digits = ref.substr(hex ? 2 : 1);
      ok = !digits.empty() &&
           digits.find_first_not_of(hex ? "0123456789abcdefABCDEF" : "0123456789") == std::string::npos;
      if (ok) {
        unsigned long cp = std::stoul(digits, nullptr, hex ? 16 : 10);
        ok = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF));
      }
    }
    if (!ok) fail(fmt::format("invalid entity reference '&{};'", ref));
    i_ = semi + 1;
  }
  void processing_instruction() {
    expect("<?");
    size_t end = s_.find("?>", i_);
    if (end == std::string::npos) fail("unterminated processing instruction");
    i_ = end + 2;
  }
  void comment() {
    expect("<!--");
    size_t end = s_.find("--", i_);
    if (end == std::string::npos || s_.compare(end, 3, "-->") != 0)
      fail("unterminated comment or '--' inside a comment");
    i_ = end + 3;
  }
  void misc() {
    for (;;) {
      spaces();
      if (starts("<!--"))
        comment();
      else if (starts("<?"))
        processing_instruction();
      else if (starts("<!DOCTYPE"))
        fail("DOCTYPE is not supported");
      else
        return;
    }
  }
  void attribute_value() {
    if (!peek('"') && !peek('\'')) fail("expected a quoted attribute value");
    char q = s_[i_++];
    for (;;) {
      if (i_ >= s_.size()) fail("unterminated attribute value");
      char c = s_[i_];
      if (c == q) break;
      if (c == '<') fail("'<' inside an attribute value");
      if (c == '&') {
        reference();
        continue;
      }
      character(static_cast<unsigned char>(c));
      ++i_;
    }
    ++i_;
  }
  void element(XmlSummary& out) {
    expect("<");
    std::string tag = name();
    if (root_.empty()) root_ = tag;
    ++out.elements;
    out.names.push_back(tag);
    std::set<std::string> attrs;
    for (;;) {
      size_t before = i_;
      spaces();
      if (starts("/>")) {
        i_ += 2;
        return;
      }
      if (peek('>')) {
        ++i_;
        break;
      }
      if (i_ == before) fail(fmt::format("expected whitespace, '>' or '/>' in <{}>", tag));
      std::string attr = name();
      if (!attrs.insert(attr).second) fail(fmt::format("duplicate attribute '{}' in <{}>", attr, tag));
      spaces();
      expect("=");
      spaces();
      attribute_value();
    }
    // Content until the matching end tag.
    for (;;) {
      if (i_ >= s_.size()) fail(fmt::format("element <{}> is not closed", tag));
      if (starts("</")) {
        i_ += 2;
        std::string end = name();
        if (end != tag) fail(fmt::format("end tag </{}> does not match <{}>", end, tag));
        spaces();
        expect(">");
        return;
      }
      if (starts("<!--"))
        comment();
      else if (starts("<![CDATA[")) {
        size_t end = s_.find("]]>", i_);
        if (end == std::string::npos) fail("unterminated CDATA section");
        i_ = end + 3;
      } else if (starts("<?"))
        processing_instruction();
      else if (peek('<'))
        element(out);
      else if (peek('&'))
        reference();
      else {
        if (starts("]]>")) fail("']]>' in character data");
        character(static_cast<unsigned char>(s_[i_]));
        ++i_;
      }
    }
  }

  const std::string& s_;
  size_t i_ = 0;
  std::string root_;
};

}  // namespace

std::optional<std::string> xml_wellformed_error(const std::string& text, XmlSummary* summary) {
  Checker c(text);
  XmlSummary local;
  try {
    c.document(local);
  } catch (const XmlError& e) {
    return fmt::format("{}: {}", c.where(c.pos()), e.message);
  }
  if (summary) *summary = std::move(local);
  return std::nullopt;
}

}  // namespace tdc::harness
