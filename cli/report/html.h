// Small HTML helpers shared by the report's page and its SVG charts.
#pragma once

#include <string>
#include <string_view>

namespace tdc::cli {

// Text and attribute values: & < > " ' become entities, so a message can never open an element.
std::string html_escape(std::string_view text);

}  // namespace tdc::cli
