// The golden test's C++ side (tests/text/tokenizer_golden.py drives it): loads a tokenizer.json
// once and answers a JSON request on stdin with a JSON reply on stdout:
//   request {"texts": [...], "id_lists": [[...], ...]}
//   reply   {"encoded": [[ids of each text]], "decoded": [decode(encoded[i])],
//            "streamed": [StreamingDetokenizer's pieces of encoded[i], concatenated],
//            "stream_pieces_valid": [every piece was valid UTF-8],
//            "decoded_lists": [decode(id_lists[i])], "streamed_lists": [the same, streamed]}
// Errors go to stderr with exit status 2.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"

namespace {

using asynct::text::StreamingDetokenizer;
using asynct::text::Tokenizer;

std::string stream(const Tokenizer& t, const std::vector<std::int32_t>& ids, bool& pieces_valid) {
  StreamingDetokenizer d(t);
  std::string all;
  for (const std::int32_t id : ids) {
    const std::string piece = d.push(id);
    if (asynct::text::find_invalid_utf8(piece)) pieces_valid = false;
    all += piece;
  }
  all += d.finish();
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON < request.json\n", argv[0]);
    return 1;
  }
  try {
    const Tokenizer t = Tokenizer::from_file(argv[1]);
    std::ostringstream input;
    input << std::cin.rdbuf();
    const auto request = nlohmann::json::parse(input.str());
    nlohmann::json reply = {{"encoded", nlohmann::json::array()},       {"decoded", nlohmann::json::array()},
                            {"streamed", nlohmann::json::array()},      {"stream_pieces_valid", nlohmann::json::array()},
                            {"decoded_lists", nlohmann::json::array()}, {"streamed_lists", nlohmann::json::array()}};
    for (const auto& text : request.value("texts", nlohmann::json::array())) {
      const std::vector<std::int32_t> ids = t.encode(text.get<std::string>());
      bool valid = true;
      reply["encoded"].push_back(ids);
      reply["decoded"].push_back(t.decode(ids));
      reply["streamed"].push_back(stream(t, ids, valid));
      reply["stream_pieces_valid"].push_back(valid);
    }
    for (const auto& list : request.value("id_lists", nlohmann::json::array())) {
      const auto ids = list.get<std::vector<std::int32_t>>();
      bool valid = true;
      reply["decoded_lists"].push_back(t.decode(ids));
      reply["streamed_lists"].push_back(stream(t, ids, valid));
    }
    std::cout << reply.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_tool: %s\n", e.what());
    return 2;
  }
}
