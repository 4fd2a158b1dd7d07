// A reader of the DOM that headless Chromium prints with --dump-dom (its HTML serialization: every
// attribute double-quoted, text escaped with &amp; &lt; &gt; &nbsp;, raw text only in script and
// style), and simple CSS-like queries over it. Enough to check the report's page as the browser
// built it; not a general HTML parser.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tdc::cli::dom {

struct Node {
  std::string tag;  // lower case; "#text" for text
  std::map<std::string, std::string> attrs;
  std::string text;  // text nodes: decoded
  std::vector<std::unique_ptr<Node>> children;
  Node* parent = nullptr;

  const std::string* attr(const std::string& name) const;
  bool has_class(const std::string& cls) const;
  std::string text_content() const;  // all descendant text, concatenated
};

std::unique_ptr<Node> parse(const std::string& serialized);

// Descendant selectors of compound parts: "tag#id.class[attr][attr=value]", separated by spaces
// (values must not contain spaces or ']'). Document order.
std::vector<const Node*> select(const Node& root, const std::string& selector);
const Node* select_one(const Node& root, const std::string& selector);  // first match or nullptr

}  // namespace tdc::cli::dom
