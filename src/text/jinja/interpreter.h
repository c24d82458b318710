// Runs a parsed template against variables, with jinja2's semantics (default Undefined, the
// HuggingFace environment's filters and globals). Every error is an asynct::Error naming the
// construct and its line:column.
#pragma once

#include <string>

#include "text/jinja/ast.h"

namespace asynct::jinja {

// variables: a JSON object; each member is a template variable.
std::string render(const Body& body, const Json& variables);

}  // namespace asynct::jinja
