// Renders chat-template cases with asynct, for tests/text/compare_chat_templates.py.
//   render_chat_template CASES.json  ->  stdout: [{"ok": true, "text": ...} | {"ok": false, "error": ...}, ...]
// A case is {"template": SOURCE, "variables": {...}}, or {"tokenizer_config": {...},
// "messages": [...], "tools": [...]|null, "add_generation_prompt": bool, "extra": {...}}, which
// goes through chat_template_source and chat_template_variables as a server would.
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "text/chat_template.h"

using Json = nlohmann::ordered_json;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: render_chat_template CASES.json\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "render_chat_template: cannot read " << argv[1] << "\n";
    return 2;
  }
  Json cases = Json::parse(in);
  Json results = Json::array();
  for (const Json& c : cases) {
    Json result;
    try {
      std::string text;
      if (c.contains("template")) {
        text = asynct::ChatTemplate(c["template"].get<std::string>()).render(c["variables"]);
      } else {
        const Json& config = c["tokenizer_config"];
        Json vars = asynct::chat_template_variables(config, c["messages"], c.value("tools", Json(nullptr)),
                                                    c.value("add_generation_prompt", false), c.value("extra", Json::object()));
        text = asynct::ChatTemplate(asynct::chat_template_source(config)).render(vars);
      }
      result = {{"ok", true}, {"text", text}};
    } catch (const asynct::Error& e) {
      result = {{"ok", false}, {"error", e.what()}};
    }
    results.push_back(result);
  }
  std::cout << results.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  return 0;
}
