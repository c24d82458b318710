// What the HTTP side's files share (serve/http_server.cpp, serve/completion_route.cpp): JSON
// bodies as text, OpenAI's error object as a response, ids and Server-Sent Events.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <memory>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "serve/openai_api.h"

namespace asynct::serve {

// A body's text; bytes that are not UTF-8 (an error message can quote the client's) become U+FFFD.
inline std::string text_of(const nlohmann::ordered_json& body) {
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

inline void write_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(text_of(error_body(e)), "application/json");
}

// Answers `body` and then closes the connection, leaving the rest of the request unread: the
// provider writes it all and reports a failure, on which httplib drops the connection.
inline void answer_and_close(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_header("Connection", "close");
  auto text = std::make_shared<std::string>(body);
  res.set_content_provider(text->size(), "application/json", [text](std::size_t, std::size_t, httplib::DataSink& sink) {
    sink.write(text->data(), text->size());
    return false;
  });
}

inline std::int64_t now_seconds() { return std::int64_t(std::time(nullptr)); }

// A response id unique in this server's life.
inline std::string next_id(const char* prefix) {
  static std::atomic<std::uint64_t> counter{0};
  return std::string(prefix) + std::to_string(now_seconds()) + "-" + std::to_string(++counter);
}

inline std::string sse(const nlohmann::ordered_json& data) { return "data: " + text_of(data) + "\n\n"; }

}  // namespace asynct::serve
