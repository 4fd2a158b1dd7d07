// dom_lite: Chromium's serialized DOM back into a tree.
#include "dom_lite.h"

#include <cctype>
#include <set>
#include <sstream>
#include <stdexcept>
#include <optional>

namespace tdc::cli::dom {

namespace {

const std::set<std::string> kVoid = {"area",  "base", "br",   "col",    "embed", "hr",  "img",
                                     "input", "link", "meta", "source", "track", "wbr", "param"};
const std::set<std::string> kRawText = {"script", "style"};

void append_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string decode(const std::string& s) {
  static const std::map<std::string, unsigned> kNamed = {{"amp", '&'},  {"lt", '<'},    {"gt", '>'},
                                                         {"quot", '"'}, {"apos", '\''}, {"nbsp", 0xA0}};
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    size_t semi = s[i] == '&' ? s.find(';', i) : std::string::npos;
    if (semi == std::string::npos || semi - i > 10) {
      out += s[i];
      continue;
    }
    std::string name = s.substr(i + 1, semi - i - 1);
    if (!name.empty() && name[0] == '#') {
      unsigned cp = name.size() > 1 && (name[1] == 'x' || name[1] == 'X') ? std::stoul(name.substr(2), nullptr, 16)
                                                                          : std::stoul(name.substr(1));
      append_utf8(out, cp);
    } else if (auto it = kNamed.find(name); it != kNamed.end()) {
      append_utf8(out, it->second);
    } else {
      out += s.substr(i, semi - i + 1);
      i = semi;
      continue;
    }
    i = semi;
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

class Parser {
 public:
  explicit Parser(const std::string& s) : s_(s) {}

  std::unique_ptr<Node> run() {
    auto root = std::make_unique<Node>();
    root->tag = "#document";
    Node* cur = root.get();
    while (i_ < s_.size()) {
      if (s_.compare(i_, 4, "<!--") == 0) {
        size_t end = s_.find("-->", i_);
        i_ = end == std::string::npos ? s_.size() : end + 3;
      } else if (s_.compare(i_, 2, "<!") == 0) {
        i_ = s_.find('>', i_) + 1;  // doctype
      } else if (s_.compare(i_, 2, "</") == 0) {
        size_t end = s_.find('>', i_);
        std::string name = lower(s_.substr(i_ + 2, end - i_ - 2));
        for (Node* n = cur; n && n->parent; n = n->parent)
          if (n->tag == name) {
            cur = n->parent;
            break;
          }
        i_ = end + 1;
      } else if (s_[i_] == '<' && i_ + 1 < s_.size() && std::isalpha(static_cast<unsigned char>(s_[i_ + 1]))) {
        cur = open_element(cur);
      } else {
        size_t end = s_.find('<', i_ + 1);
        if (end == std::string::npos) end = s_.size();
        add_text(cur, decode(s_.substr(i_, end - i_)));
        i_ = end;
      }
    }
    return root;
  }

 private:
  void add_text(Node* parent, std::string text) {
    auto t = std::make_unique<Node>();
    t->tag = "#text";
    t->text = std::move(text);
    t->parent = parent;
    parent->children.push_back(std::move(t));
  }

  // Reads "<tag attrs>" at i_; returns the node that is now current.
  Node* open_element(Node* cur) {
    auto n = std::make_unique<Node>();
    size_t j = i_ + 1;
    while (j < s_.size() && !std::isspace(static_cast<unsigned char>(s_[j])) && s_[j] != '>' && s_[j] != '/') ++j;
    n->tag = lower(s_.substr(i_ + 1, j - i_ - 1));
    for (;;) {
      while (j < s_.size() && (std::isspace(static_cast<unsigned char>(s_[j])) || s_[j] == '/')) ++j;
      if (j >= s_.size() || s_[j] == '>') break;
      size_t k = j;
      while (k < s_.size() && s_[k] != '=' && s_[k] != '>' && !std::isspace(static_cast<unsigned char>(s_[k]))) ++k;
      std::string name = lower(s_.substr(j, k - j));
      std::string value;
      if (k < s_.size() && s_[k] == '=') {
        if (s_[k + 1] != '"') throw std::runtime_error("dom_lite: unquoted attribute " + name);
        size_t close = s_.find('"', k + 2);
        value = decode(s_.substr(k + 2, close - k - 2));
        k = close + 1;
      }
      n->attrs[name] = value;
      j = k;
    }
    bool self_closed = j > 0 && s_[j - 1] == '/';
    i_ = j + 1;
    n->parent = cur;
    Node* node = n.get();
    cur->children.push_back(std::move(n));
    if (kRawText.count(node->tag)) {
      size_t end = s_.find("</" + node->tag, i_);
      if (end == std::string::npos) end = s_.size();
      add_text(node, s_.substr(i_, end - i_));
      i_ = s_.find('>', end) == std::string::npos ? s_.size() : s_.find('>', end) + 1;
      return cur;
    }
    return kVoid.count(node->tag) || self_closed ? cur : node;
  }

  const std::string& s_;
  size_t i_ = 0;
};

struct Compound {
  std::string tag, id;
  std::vector<std::string> classes;
  std::vector<std::pair<std::string, std::optional<std::string>>> attrs;

  bool matches(const Node& n) const {
    if (n.tag == "#text" || n.tag == "#document") return false;
    if (!tag.empty() && n.tag != tag) return false;
    if (!id.empty() && (!n.attr("id") || *n.attr("id") != id)) return false;
    for (const auto& c : classes)
      if (!n.has_class(c)) return false;
    for (const auto& [name, value] : attrs) {
      const std::string* v = n.attr(name);
      if (!v || (value && *v != *value)) return false;
    }
    return true;
  }
};

Compound parse_compound(const std::string& s) {
  Compound c;
  size_t i = 0;
  auto word = [&]() {
    size_t b = i;
    while (i < s.size() && s[i] != '.' && s[i] != '#' && s[i] != '[') ++i;
    return s.substr(b, i - b);
  };
  c.tag = word();
  while (i < s.size()) {
    char kind = s[i++];
    if (kind == '#') {
      c.id = word();
    } else if (kind == '.') {
      c.classes.push_back(word());
    } else if (kind == '[') {
      size_t close = s.find(']', i);
      std::string body = s.substr(i, close - i);
      i = close + 1;
      size_t eq = body.find('=');
      if (eq == std::string::npos)
        c.attrs.push_back({body, std::nullopt});
      else
        c.attrs.push_back({body.substr(0, eq), body.substr(eq + 1)});
    }
  }
  return c;
}

void collect(const Node& n, const std::vector<Compound>& parts, size_t k, std::vector<const Node*>& out) {
  for (const auto& child : n.children) {
    if (parts[k].matches(*child)) {
      if (k + 1 == parts.size())
        out.push_back(child.get());
      else
        collect(*child, parts, k + 1, out);
    }
    collect(*child, parts, k, out);
  }
}

}  // namespace

const std::string* Node::attr(const std::string& name) const {
  auto it = attrs.find(name);
  return it == attrs.end() ? nullptr : &it->second;
}

bool Node::has_class(const std::string& cls) const {
  const std::string* c = attr("class");
  if (!c) return false;
  std::istringstream in(*c);
  for (std::string w; in >> w;)
    if (w == cls) return true;
  return false;
}

std::string Node::text_content() const {
  if (tag == "#text") return text;
  std::string out;
  for (const auto& c : children) out += c->text_content();
  return out;
}

std::unique_ptr<Node> parse(const std::string& serialized) { return Parser(serialized).run(); }

std::vector<const Node*> select(const Node& root, const std::string& selector) {
  std::vector<Compound> parts;
  std::istringstream in(selector);
  for (std::string w; in >> w;) parts.push_back(parse_compound(w));
  std::vector<const Node*> out;
  if (!parts.empty()) collect(root, parts, 0, out);
  // A node reachable along several ancestor chains is listed once, in document order.
  std::vector<const Node*> unique;
  std::set<const Node*> seen;
  for (const Node* n : out)
    if (seen.insert(n).second) unique.push_back(n);
  return unique;
}

const Node* select_one(const Node& root, const std::string& selector) {
  auto all = select(root, selector);
  return all.empty() ? nullptr : all.front();
}

}  // namespace tdc::cli::dom
