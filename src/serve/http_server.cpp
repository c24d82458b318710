#include "serve/http_server.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <utility>

#include <httplib.h>

#include "core/error.h"
#include "serve/http_util.h"
#include "serve/openai_api.h"

namespace asynct::serve {
namespace {

using json = nlohmann::ordered_json;

using Clock = std::chrono::steady_clock;

// Whether httplib reads a body for this method: a refusal before it is read closes the connection.
bool carries_body(const httplib::Request& req) {
  return req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "DELETE";
}

// The request this thread serves, for its access-log line.
struct AccessRecord {
  Clock::time_point start{};                      // its headers read; epoch: not routed
  std::optional<Clock::time_point> first_output;  // its first token out
  std::int64_t prompt_tokens = -1, output_tokens = -1;
  std::string request_id;
};
thread_local AccessRecord access;

// At most 128 printable characters without spaces: safe to echo and to log.
bool sane_request_id(const std::string& id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

// A path as the log shows it: printable, at most 200 bytes.
std::string printable(const std::string& text) {
  std::string out = text.substr(0, 200);
  for (char& c : out)
    if (c <= 0x20 || c >= 0x7f) c = '?';
  return out;
}

// Whether `given` is "Bearer <key>", in time that depends on its length only.
bool bearer_matches(const std::string& given, const std::string& key) {
  const std::string prefix = "bearer ";
  if (given.size() < prefix.size()) return false;
  unsigned diff = given.size() - prefix.size() != key.size() ? 1u : 0u;
  for (std::size_t i = 0; i < prefix.size(); ++i) diff |= unsigned(std::tolower(static_cast<unsigned char>(given[i])) ^ prefix[i]);
  for (std::size_t i = prefix.size(); i < given.size(); ++i)
    diff |= unsigned(static_cast<unsigned char>(given[i]) ^ static_cast<unsigned char>(key[(i - prefix.size()) % key.size()]));
  return diff == 0;
}

}  // namespace

void HttpServer::log_tokens(std::int64_t prompt_tokens, std::int64_t output_tokens) {
  access.prompt_tokens = prompt_tokens;
  access.output_tokens = output_tokens;
}

void HttpServer::log_first_output() {
  if (!access.first_output) access.first_output = Clock::now();
}

void HttpServer::log_access(const httplib::Request& req, const httplib::Response& res) {
  const AccessRecord a = std::exchange(access, AccessRecord{});
  const auto ms = [&](const std::optional<Clock::time_point>& t) {
    if (!t || a.start == Clock::time_point{}) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", std::chrono::duration<double, std::milli>(*t - a.start).count());
    return std::string(text);
  };
  const auto count = [](std::int64_t n) { return n < 0 ? std::string("-") : std::to_string(n); };
  std::fprintf(stderr, "asynct serve: %s %s %d prompt_tokens=%s output_tokens=%s ttft_ms=%s total_ms=%s request_id=%s\n",
               printable(req.method).c_str(), printable(req.path).c_str(), res.status, count(a.prompt_tokens).c_str(),
               count(a.output_tokens).c_str(), ms(a.first_output).c_str(), ms(Clock::now()).c_str(),
               a.request_id.empty() ? "-" : a.request_id.c_str());
}

void HttpServer::refuse(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  metrics_.http_error(e.status);
  if (carries_body(req))
    answer_and_close(res, e.status, text_of(error_body(e)));
  else
    write_error(res, e);
}

bool HttpServer::check_request(const httplib::Request& req, httplib::Response& res) {
  access = AccessRecord{};
  access.start = Clock::now();
  const std::string sent = req.get_header_value("X-Request-Id");
  access.request_id = sane_request_id(sent) ? sent : next_id("req-");
  res.set_header("X-Request-Id", access.request_id);

  const Route* route = find_route(req.path);
  const std::string origin = req.get_header_value("Origin");
  if (!options_.allowed_origins.empty() && !origin.empty()) {
    const auto& allowed = options_.allowed_origins;
    const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
    const bool preflight = req.method == "OPTIONS" && req.has_header("Access-Control-Request-Method");
    if (any || std::find(allowed.begin(), allowed.end(), origin) != allowed.end()) {
      res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
      res.set_header("Vary", "Origin");
      res.set_header("Access-Control-Expose-Headers", "X-Request-Id");
      if (preflight && route) {
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", route->method);
        res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Request-Id");
        res.set_header("Access-Control-Max-Age", "600");
        return true;
      }
    } else if (preflight) {
      refuse(req, res, ApiError(403, "the origin " + origin.substr(0, 100) + " is not allowed (--allowed-origins)"));
      return true;
    }
  }
  if (!options_.api_key.empty() && !(route && route->open) &&
      !bearer_matches(req.get_header_value("Authorization"), options_.api_key)) {
    res.set_header("WWW-Authenticate", "Bearer");
    refuse(req, res, ApiError(401, "a valid API key is needed: send the header 'Authorization: Bearer <key>'"));
    return true;
  }
  if (!route) {
    refuse(req, res, ApiError(404, "no route " + req.method + " " + req.path));
    return true;
  }
  if (req.method != route->method && !(req.method == "HEAD" && std::string(route->method) == "GET")) {
    res.set_header("Allow", route->method);
    refuse(req, res, ApiError(405, "the route " + req.path + " takes " + route->method + ", not " + req.method));
    return true;
  }
  return false;
}

// The routes: each path (a prefix ends in '/': the rest is the route's argument) with its method
// and handler. One table serves routing, 405's Allow and the checks before a handler.
const std::vector<HttpServer::Route>& HttpServer::routes() {
  static const std::vector<Route> table = {
      {"/v1/completions", "POST", &HttpServer::handle_completions},
      {"/v1/chat/completions", "POST", &HttpServer::handle_chat_completions},
      {"/v1/models", "GET", &HttpServer::handle_models},
      {"/v1/models/", "GET", &HttpServer::handle_model},
      {"/tokenize", "POST", &HttpServer::handle_tokenize},
      {"/detokenize", "POST", &HttpServer::handle_detokenize},
      {"/health", "GET", &HttpServer::handle_health, true},
      {"/metrics", "GET", &HttpServer::handle_metrics, true},
  };
  return table;
}

const HttpServer::Route* HttpServer::find_route(const std::string& path) {
  for (const Route& route : routes()) {
    const std::string p = route.path;
    if (p.back() == '/' ? path.size() > p.size() && path.compare(0, p.size(), p) == 0 : path == p) return &route;
  }
  return nullptr;
}

bool HttpServer::read_body(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader,
                           std::string& body) {
  const std::size_t limit = options_.max_body_bytes;
  const auto refuse = [&](const ApiError& e) {
    metrics_.http_error(e.status);
    answer_and_close(res, e.status, text_of(error_body(e)));
    return false;
  };
  const ApiError too_large(413, "the request body is over the server's limit of " + std::to_string(limit >> 20) + " MiB");
  // httplib would hand a multipart body's parts to a receiver not given here.
  if (req.is_multipart_form_data()) return refuse(ApiError(400, "the body must be JSON, not multipart/form-data"));
  if (req.has_header("Content-Length")) {
    const std::string length = req.get_header_value("Content-Length");
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(length.c_str(), &end, 10);
    if (length.empty() || *end != '\0' || errno != 0 || length[0] == '-')
      return refuse(ApiError(400, "Content-Length '" + length.substr(0, 32) + "' is not a number"));
    if (n > limit) return refuse(too_large);  // before a byte is read
  }
  // Counted as they arrive, whatever the framing (a chunked body has no Content-Length).
  bool over = false;
  const bool read = reader([&](const char* data, std::size_t n) {
    if (body.size() + n > limit) return !(over = true);
    body.append(data, n);
    return true;
  });
  if (over) return refuse(too_large);
  if (!read) return refuse(ApiError(400, "the request body could not be read (a broken chunked encoding, or the client left)"));
  return true;
}

void HttpServer::send_error(httplib::Response& res, const ApiError& e) {
  metrics_.http_error(e.status);
  write_error(res, e);
}

std::vector<TokenLogprob> HttpServer::logprobs_of(const std::vector<GeneratedToken>& tokens) const {
  std::vector<TokenLogprob> out;
  for (const GeneratedToken& g : tokens) {
    TokenLogprob t{text_.token_bytes(g.token), g.logprob, {}};
    for (const TopLogprob& top : g.top_logprobs) t.top.emplace_back(text_.token_bytes(top.id), top.logprob);
    out.push_back(std::move(t));
  }
  return out;
}

HttpServer::HttpServer(EngineWorker& worker, const ModelText& text, ServerMetrics& metrics, HttpOptions options)
    : worker_(worker),
      text_(text),
      metrics_(metrics),
      options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()) {
  httplib::Server& s = *server_;
  const int threads = options_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(std::size_t(threads)); };
  s.set_payload_max_length(options_.max_body_bytes);  // POST bodies are counted by read_body
  // Each token goes out as its own small write: without TCP_NODELAY, Nagle's algorithm holds a
  // write back until the one before is acknowledged.
  s.set_tcp_nodelay(true);

  // Before a body is read: every request's shared checks.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return check_request(req, res) ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_logger([](const httplib::Request& req, const httplib::Response& res) { log_access(req, res); });
  for (const Route& route : routes()) {
    const std::string pattern = route.path[std::string(route.path).size() - 1] == '/' ? std::string(route.path) + "(.+)" : route.path;
    const Handler handle = route.handle;
    if (std::string(route.method) == "POST") {
      s.Post(pattern, [this, handle](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
        std::string body;
        if (read_body(req, res, reader, body)) run(handle, req, res, body);
      });
    } else {
      s.Get(pattern, [this, handle](const httplib::Request& req, httplib::Response& res) { run(handle, req, res, ""); });
    }
  }
  s.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "internal error: " + what));
  });
  // httplib's own answers (a request it cannot parse) as OpenAI error objects.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return;
    const std::string message = res.status == 404   ? "no route " + req.method + " " + req.path
                                : res.status == 413 ? "the request body is over the server's limit"
                                                    : "the request failed (HTTP " + std::to_string(res.status) + ")";
    send_error(res, ApiError(res.status, message));
  });
}

HttpServer::~HttpServer() = default;

void HttpServer::run(Handler handle, const httplib::Request& req, httplib::Response& res, const std::string& body) {
  try {
    (this->*handle)(req, res, body);
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

void HttpServer::handle_completions(const httplib::Request&, httplib::Response& res, const std::string& body) {
  complete(Endpoint::Completions, body, res);
}

void HttpServer::handle_chat_completions(const httplib::Request&, httplib::Response& res, const std::string& body) {
  complete(Endpoint::ChatCompletions, body, res);
}

json HttpServer::model_object() const {
  return {{"id", options_.model_name}, {"object", "model"}, {"created", now_seconds()},
          {"owned_by", "asynct"}, {"max_model_len", options_.context}};
}

void HttpServer::handle_models(const httplib::Request&, httplib::Response& res, const std::string&) {
  res.set_content(text_of(json{{"object", "list"}, {"data", json::array({model_object()})}}), "application/json");
}

void HttpServer::handle_model(const httplib::Request& req, httplib::Response& res, const std::string&) {
  const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
  if (id != options_.model_name)
    throw ApiError(404, "The model '" + id + "' does not exist; this server serves '" + options_.model_name + "'", "model");
  res.set_content(text_of(model_object()), "application/json");
}

void HttpServer::handle_tokenize(const httplib::Request&, httplib::Response& res, const std::string& body) {
  const TokenizeRequest r = parse_tokenize_request(body, options_.model_name);
  std::vector<std::int32_t> ids;
  {
    const std::lock_guard<std::mutex> lock(text_mutex_);
    try {
      if (r.chat) {
        if (!text_.has_chat_template()) throw ApiError(400, "this model has no chat template: tokenize a prompt", "messages");
        ids = text_.chat_ids(r.messages, r.tools, r.add_generation_prompt);
      } else {
        ids = text_.prompt_ids(r.prompt, "prompt", r.add_special_tokens);
      }
    } catch (const Error& e) {
      throw ApiError(400, e.what(), r.chat ? "messages" : "prompt");
    }
  }
  res.set_content(text_of(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", options_.context}}), "application/json");
}

void HttpServer::handle_detokenize(const httplib::Request&, httplib::Response& res, const std::string& body) {
  const std::int32_t vocab = std::min(options_.vocab_size, text_.vocab_size());
  const std::vector<std::int32_t> ids = parse_detokenize_request(body, options_.model_name, vocab);
  std::string text;
  for (const std::int32_t id : ids) text += text_.token_bytes(id);
  res.set_content(text_of(json{{"prompt", text}}), "application/json");
}

void HttpServer::handle_health(const httplib::Request&, httplib::Response& res, const std::string&) {
  // 503 from the first moment of draining: a load balancer stops sending before the server closes.
  if (worker_.draining())
    write_error(res, ApiError(503, "the server is shutting down"));
  else if (const std::string failure = worker_.failure(); !failure.empty())
    write_error(res, ApiError(503, "the engine failed: " + failure));
  else
    res.set_content(R"({"status":"ok"})", "application/json");
}

void HttpServer::handle_metrics(const httplib::Request&, httplib::Response& res, const std::string&) {
  res.set_content(metrics_.prometheus_text(), "text/plain; version=0.0.4");
}

int HttpServer::bind() {
  const int port = options_.port == 0 ? server_->bind_to_any_port(options_.host)
                                      : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  check(port > 0, "cannot listen on ", options_.host, ":", options_.port, " (in use, or not an address of this machine)");
  return port;
}

void HttpServer::listen() { server_->listen_after_bind(); }

void HttpServer::stop() { server_->stop(); }

}  // namespace asynct::serve
