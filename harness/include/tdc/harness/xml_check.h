// A small XML 1.0 well-formedness checker (no DTDs): enough to prove that the JUnit files tdc
// writes parse in CI tools. Used by `tdc run --check` and by the results unit tests.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tdc::harness {

struct XmlSummary {
  std::string root;  // name of the root element
  int elements = 0;
  std::vector<std::string> names;            // every element's name, in document order
  int count(const std::string& name) const;  // elements with that name
};

// The error ("line 3, column 7: ...") if text is not well-formed, else nullopt; fills summary.
std::optional<std::string> xml_wellformed_error(const std::string& text, XmlSummary* summary = nullptr);

}  // namespace tdc::harness
