// `asynct serve`'s HTTP side, on cpp-httplib: the OpenAI routes over an EngineWorker.
//
//   POST /v1/completions, POST /v1/chat/completions   (stream: true as Server-Sent Events,
//                                                       ending in "data: [DONE]"; completions
//                                                       take a list of prompts too)
//   GET  /v1/models, GET /v1/models/{id}
//   POST /tokenize, POST /detokenize                  (vLLM's shapes)
//   GET  /metrics (Prometheus text: serve/metrics.h), GET /health (200, or 503 from the moment
//                                                       the worker drains)
//
// Each connection has a thread of a pool of `threads`; a streaming response holds its thread
// until it ends, so the pool is sized above the requests the worker takes at once. Errors are
// OpenAI's error object: 400 for a bad body or field, a prompt that does not fit the context,
// or text the tokenizer refuses; 404 for another model or an unknown route; 405 (with Allow) for
// a known route asked with another method; 413 for a body over max_body_bytes (counted as the
// bytes arrive, chunked or not; the connection is then closed, the rest unread); 429
// (Retry-After: 1) when the worker is full, 503 while it drains; 500 for a failure inside; 401
// without the API key when one is set. Every response carries X-Request-Id, and every request
// gets an access-log line on stderr. The completion routes are in serve/completion_route.cpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/model_text.h"
#include "serve/engine_worker.h"
#include "serve/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
class ContentReader;
}

namespace asynct::serve {

enum class Endpoint;
struct ApiError;
struct TokenLogprob;
class StructuredOutput;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0: any free port (bind() says which)
  int threads = 64;
  std::size_t max_body_bytes = 8u << 20;
  std::string model_name;                   // what /v1/models lists and requests must name
  std::int64_t context = 0;                 // the model's context (prompt + output tokens)
  std::vector<std::int32_t> eos_token_ids;  // the model's end-of-sequence tokens
  std::int32_t vocab_size = 0;              // the model's: prompt ids must lie below it
  std::string system_fingerprint;           // in every completion body and chunk
  // Non-empty: every route but /health and /metrics wants "Authorization: Bearer <api_key>" (401).
  std::string api_key;
  // Origins a browser may call from (CORS; "*": any); empty: no CORS headers, OPTIONS a 405.
  std::vector<std::string> allowed_origins;
  // Compiles response_format (serve/structured_output.h); null: response_format is refused.
  const StructuredOutput* structured_output = nullptr;
};

class HttpServer {
 public:
  // `text` turns prompts into ids and ids into text; it and `worker` outlive the server.
  HttpServer(EngineWorker& worker, const ModelText& text, ServerMetrics& metrics, HttpOptions options);
  ~HttpServer();

  // Binds the address; returns the port. Throws Error when it cannot.
  int bind();
  // Serves until stop(); returns then.
  void listen();
  // From any thread (a signal handler's thread): stops accepting and ends listen().
  void stop();
  // Streaming responses not yet closed.
  int open_streams() const { return open_streams_; }

 private:
  using Handler = void (HttpServer::*)(const httplib::Request&, httplib::Response&, const std::string& body);
  struct Route {
    const char* path;    // ending in '/': a prefix, the rest the route's argument (req.matches[1])
    const char* method;  // GET (HEAD too) or POST (its body read by read_body first)
    Handler handle;      // throws ApiError for the client's errors
    bool open = false;   // answered without the API key (/health, /metrics)
  };
  static const std::vector<Route>& routes();
  static const Route* find_route(const std::string& path);  // nullptr: no such route
  // Calls the handler, answering its ApiError.
  void run(Handler handle, const httplib::Request& req, httplib::Response& res, const std::string& body);

  void handle_completions(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void handle_chat_completions(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void handle_models(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void handle_model(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void handle_health(const httplib::Request& req, httplib::Response& res, const std::string& body);
  void handle_metrics(const httplib::Request& req, httplib::Response& res, const std::string& body);
  // A completion request: its choices to the worker, the response whole or streamed
  // (serve/completion_route.cpp). Throws ApiError.
  void complete(Endpoint endpoint, const std::string& body, httplib::Response& res);
  nlohmann::ordered_json model_object() const;
  // The checks every request passes before its route reads a body, in order: its request id
  // (X-Request-Id, the client's when sane), CORS (a preflight answered here), the API key (401),
  // the route (404) and its method (405). Answers and returns true when it refuses.
  bool check_request(const httplib::Request& req, httplib::Response& res);
  // Refuses before the body is read: the connection closes when the request carries one.
  void refuse(const httplib::Request& req, httplib::Response& res, const ApiError& e);
  // The access log's counts for the request this thread serves (httplib serves a connection's
  // requests, its routing, streaming and logging, on one thread).
  static void log_tokens(std::int64_t prompt_tokens, std::int64_t output_tokens);
  static void log_first_output();
  // One line on stderr a request: method, route, status, prompt and output tokens, time to the
  // first output, total time, request id.
  static void log_access(const httplib::Request& req, const httplib::Response& res);

  // Reads a POST body into `body`, at most max_body_bytes counted as they arrive (chunked or
  // not). False when it answered instead: 413 past the limit (read no further), 400 for a
  // broken body; either closes the connection after the answer.
  bool read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                 std::string& body);
  // Answers with OpenAI's error object, and counts it.
  void send_error(httplib::Response& res, const ApiError& e);
  // Generated tokens' logprobs with their tokens' bytes.
  std::vector<TokenLogprob> logprobs_of(const std::vector<GeneratedToken>& tokens) const;

  EngineWorker& worker_;
  const ModelText& text_;
  ServerMetrics& metrics_;
  std::mutex text_mutex_;  // the tokenizer and the chat template, one request at a time
  HttpOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::atomic<int> open_streams_{0};
};

}  // namespace asynct::serve
