// HTML escaping for the report: the harness's XML escaping (markup characters, control
// characters and invalid UTF-8), which HTML reads the same way.
#include "report/html.h"

#include "tdc/harness/results.h"

namespace tdc::cli {

std::string html_escape(std::string_view text) { return harness::xml_escape(std::string(text), false); }

}  // namespace tdc::cli
