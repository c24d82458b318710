#include "serve/http_server.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <functional>
#include <optional>

#include <httplib.h>

#include "core/error.h"
#include "serve/openai_api.h"

namespace asynct::serve {
namespace {

using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

// A body's text; bytes that are not UTF-8 (an error message can quote the client's) become U+FFFD.
std::string text_of(const json& body) { return body.dump(-1, ' ', false, json::error_handler_t::replace); }

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(text_of(error_body(e)), "application/json");
}

std::int64_t now_seconds() { return std::int64_t(std::time(nullptr)); }

// A response id unique in this server's life.
std::string next_id(const char* prefix) {
  static std::atomic<std::uint64_t> counter{0};
  return std::string(prefix) + std::to_string(now_seconds()) + "-" + std::to_string(++counter);
}

std::string sse(const json& data) { return "data: " + text_of(data) + "\n\n"; }

// A streaming response's state, shared by its content provider and its releaser.
struct ChoiceState {
  bool first = true;             // no chunk sent yet
  bool done = false;             // its last chunk sent
  std::int64_t token_bytes = 0;  // the bytes of the tokens whose logprobs were sent
};
struct StreamState {
  CompletionRequest request;
  std::vector<std::shared_ptr<RequestStream>> streams;  // one a choice
  std::vector<ChoiceState> choices;
  std::string id;
  std::int64_t created = 0;
  Usage usage;
};

// A whole (not streamed) response's choices, read as they run.
struct WholeState {
  CompletionRequest request;
  std::vector<std::shared_ptr<RequestStream>> streams;  // one a choice
  std::vector<Choice> choices;
  std::vector<std::vector<GeneratedToken>> tokens;      // each choice's, for its logprobs
  std::vector<char> ended;                              // each choice's: its last event came
  std::size_t done = 0;                                 // choices ended
  std::function<std::vector<TokenLogprob>(const std::vector<GeneratedToken>&)> logprobs_of;
  std::optional<ApiError> failed;                       // a choice's error: the body
  std::string id;
  std::int64_t created = 0;
  Usage usage;
  std::chrono::steady_clock::time_point last_write;

  void cancel() {
    for (const auto& stream : streams) stream->cancel();
  }
  void take(std::size_t i, StreamEvent& event) {
    Choice& choice = choices[i];
    choice.text += event.text;
    tokens[i].insert(tokens[i].end(), event.tokens.begin(), event.tokens.end());
    if (!event.done) return;
    ended[i] = 1;
    ++done;
    if (!event.error.empty()) {
      if (!failed) failed = ApiError(event.engine_failed ? 500 : 400, event.error);
      cancel();  // the other choices end too
      return;
    }
    choice.finish_reason = openai_finish_reason(event.finish_reason);
    choice.logprobs = logprobs_of(tokens[i]);
    usage.completion_tokens += event.completion_tokens;
    if (i == 0) usage.cached_tokens = event.cached_tokens;  // the prompt's, once: the first choice's
  }
  // One call of the content provider: the events that are ready (waiting a little for one),
  // the body once every choice has ended, a space when a second has passed without a write.
  bool provide(httplib::DataSink& sink) {
    using namespace std::chrono_literals;
    bool any = false;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      StreamEvent event;
      while (!ended[i] && streams[i]->next(event, 0ms)) take(i, event), any = true;
    }
    if (!any && done < streams.size())
      for (std::size_t i = 0; i < streams.size(); ++i) {
        if (ended[i]) continue;
        StreamEvent event;
        if (streams[i]->next(event, 200ms)) take(i, event);
        break;
      }
    const auto now = std::chrono::steady_clock::now();
    if (done == streams.size()) {
      const std::string body =
          failed ? text_of(error_body(*failed)) : text_of(completion_response(request, id, created, choices, usage));
      if (!sink.write(body.data(), body.size())) return false;
      sink.done();
      return true;
    }
    if (now - last_write >= 1s) {
      if (!sink.write(" ", 1)) return false;
      last_write = now;
    }
    return true;
  }
};

// Answers `body` and then closes the connection, leaving the rest of the request unread: the
// provider writes it all and reports a failure, on which httplib drops the connection.
void answer_and_close(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_header("Connection", "close");
  auto text = std::make_shared<std::string>(body);
  res.set_content_provider(text->size(), "application/json", [text](std::size_t, std::size_t, httplib::DataSink& sink) {
    sink.write(text->data(), text->size());
    return false;
  });
}

// The methods a route takes (what a 405's Allow lists); nullptr for a path that is no route.
const char* route_methods(const std::string& path) {
  static const std::pair<const char*, const char*> routes[] = {
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}, {"/v1/models", "GET"},
      {"/health", "GET"},          {"/metrics", "GET"}};
  for (const auto& [route, methods] : routes)
    if (path == route) return methods;
  return nullptr;
}

bool method_allowed(const std::string& method, const std::string& allow) {
  return method == allow || (method == "HEAD" && allow == "GET");
}

// Whether httplib reads a body for this method: a refusal before it is read closes the connection.
bool carries_body(const httplib::Request& req) {
  return req.method == "POST" || req.method == "PUT" || req.method == "PATCH" || req.method == "DELETE";
}

}  // namespace

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
  s.set_payload_max_length(options_.max_body_bytes);
  // Each token goes out as its own small write: without TCP_NODELAY, Nagle's algorithm holds a
  // write back until the one before is acknowledged.
  s.set_tcp_nodelay(true);

  // Before a body is read: an unknown route is a 404, a known one asked with another method a
  // 405 with Allow.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const char* allow = route_methods(req.path);
    if (allow && method_allowed(req.method, allow)) return httplib::Server::HandlerResponse::Unhandled;
    const ApiError e = allow ? ApiError(405, "the route " + req.path + " takes " + allow + ", not " + req.method)
                             : ApiError(404, "no route " + req.method + " " + req.path);
    if (allow) res.set_header("Allow", allow);
    metrics_.http_error(e.status);
    if (carries_body(req))
      answer_and_close(res, e.status, text_of(error_body(e)));
    else
      write_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  const auto completion = [this](Endpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
      std::string body;
      if (!read_body(req, res, reader, body)) return;
      try {
        CompletionRequest r = parse_completion_request(endpoint, body, options_.model_name);
        std::vector<std::int32_t> ids;
        std::vector<std::unique_ptr<OutputText>> outs;  // each choice's text
        {
          const std::lock_guard<std::mutex> lock(text_mutex_);
          try {
            if (endpoint == Endpoint::ChatCompletions) {
              if (!text_.has_chat_template()) throw ApiError(400, "this model has no chat template: use /v1/completions", "messages");
              ids = text_.chat_ids(r.messages);
            } else if (!r.prompt_ids.empty()) {
              ids = r.prompt_ids;
            } else {
              ids = text_.prompt_ids(r.prompt, "prompt");
            }
            for (int i = 0; i < r.n; ++i) outs.push_back(text_.output(r.stop));
          } catch (const Error& e) {
            throw ApiError(400, e.what(), endpoint == Endpoint::ChatCompletions ? "messages" : "prompt");
          }
        }
        if (ids.empty()) throw ApiError(400, "the prompt is empty", "prompt");
        for (const std::int32_t id : ids)
          if (id >= options_.vocab_size)
            throw ApiError(400, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                    std::to_string(options_.vocab_size) + ")", "prompt");
        const std::int64_t prompt = std::int64_t(ids.size());
        if (prompt >= options_.context)
          throw ApiError(400, "the prompt is " + std::to_string(prompt) + " tokens; the model's context is " +
                                  std::to_string(options_.context) + " tokens (prompt and output together)",
                         endpoint == Endpoint::ChatCompletions ? "messages" : "prompt");
        const std::int64_t max_tokens = r.max_tokens > 0 ? r.max_tokens : options_.context - prompt;
        if (prompt + max_tokens > options_.context)
          throw ApiError(400, "the prompt (" + std::to_string(prompt) + " tokens) and max_tokens (" +
                                  std::to_string(max_tokens) + ") are over the model's context of " +
                                  std::to_string(options_.context) + " tokens",
                         "max_tokens");
        // n choices: n requests of one prompt, seeds seed, seed + 1, ...
        if (r.n > worker_.max_in_flight())
          throw ApiError(400, "n is " + std::to_string(r.n) + "; this server takes " + std::to_string(worker_.max_in_flight()) +
                                  " requests at once", "n");
        std::vector<Request> requests(std::size_t(r.n));
        for (int i = 0; i < r.n; ++i) {
          Request& er = requests[std::size_t(i)];
          er.prompt = ids;
          er.max_tokens = int(max_tokens);
          er.sampling = r.sampling;
          er.sampling.seed = r.sampling.seed + std::uint64_t(i);
          if (!r.ignore_eos) er.eos_token_ids = options_.eos_token_ids;
        }
        std::vector<std::shared_ptr<RequestStream>> streams = worker_.submit_group(std::move(requests), std::move(outs));
        if (streams.empty() && worker_.draining()) throw ApiError(503, "the server is shutting down");
        if (streams.empty()) throw ApiError(429, "the server is busy: too many requests at once; try again");

        const std::string id = next_id(endpoint == Endpoint::ChatCompletions ? "chatcmpl-" : "cmpl-");
        const std::int64_t created = now_seconds();
        if (!r.stream) {
          // Refused by the engine: an error status. Taken: the response comes through a content
          // provider that also sends a space (JSON allows leading whitespace) every second while
          // the choices run: a write that fails means the client has left, and its choices end.
          for (const auto& stream : streams) {
            StreamEvent refused;
            if (!stream->wait_taken(refused)) {
              for (const auto& other : streams) other->cancel();
              throw ApiError(refused.engine_failed ? 500 : 400, refused.error);
            }
          }
          auto whole = std::make_shared<WholeState>();
          whole->streams = streams;
          whole->choices.resize(streams.size());
          whole->tokens.resize(streams.size());
          whole->ended.resize(streams.size(), 0);
          whole->logprobs_of = [this](const std::vector<GeneratedToken>& tokens) { return logprobs_of(tokens); };
          whole->usage.prompt_tokens = prompt;
          whole->id = id;
          whole->created = created;
          whole->request = std::move(r);
          whole->last_write = std::chrono::steady_clock::now();
          ++open_streams_;
          res.set_chunked_content_provider(
              "application/json", [whole](std::size_t, httplib::DataSink& sink) { return whole->provide(sink); },
              [this, whole](bool success) {
                if (!success) whole->cancel();  // the client left
                --open_streams_;
              });
          return;
        }
        auto state = std::make_shared<StreamState>();
        state->request = std::move(r);
        state->streams = streams;
        state->choices.resize(streams.size());
        state->id = id;
        state->created = created;
        state->usage.prompt_tokens = prompt;
        // One event of choice i as SSE: a text chunk, or its last chunk (an error object when it failed).
        const auto chunk_text = [this](StreamState& st, std::size_t i, const StreamEvent& event) {
          ChoiceState& c = st.choices[i];
          std::string text;
          if (!event.done) {
            const std::vector<TokenLogprob> logprobs = logprobs_of(event.tokens);
            text = sse(completion_chunk(st.request, st.id, st.created, event.text, "", c.first, logprobs, c.token_bytes, int(i)));
            for (const TokenLogprob& t : logprobs) c.token_bytes += std::int64_t(t.token.size());
            c.first = false;
          } else if (!event.error.empty()) {
            text = sse(error_body(ApiError(500, event.error)));
            c.done = true;
          } else {
            st.usage.completion_tokens += event.completion_tokens;
            if (i == 0) st.usage.cached_tokens = event.cached_tokens;  // the prompt's, once: the first choice's
            text = sse(completion_chunk(st.request, st.id, st.created, event.text, openai_finish_reason(event.finish_reason),
                                        c.first, {}, c.token_bytes, int(i)));
            c.done = true;
          }
          return text;
        };
        res.set_header("Cache-Control", "no-cache");
        ++open_streams_;
        res.set_chunked_content_provider(
            "text/event-stream",
            [state, chunk_text](std::size_t, httplib::DataSink& sink) {
              // Every choice's events that are ready, in choice order; when none is, a short wait
              // on the first unfinished one.
              std::string out;
              for (std::size_t i = 0; i < state->streams.size(); ++i) {
                ChoiceState& choice = state->choices[i];
                StreamEvent event;
                while (!choice.done && state->streams[i]->next(event, 0ms)) out += chunk_text(*state, i, event);
              }
              if (out.empty()) {
                for (std::size_t i = 0; i < state->streams.size(); ++i) {
                  if (state->choices[i].done) continue;
                  StreamEvent event;
                  if (state->streams[i]->next(event, 20ms)) out += chunk_text(*state, i, event);
                  break;
                }
              }
              const bool all_done = std::all_of(state->choices.begin(), state->choices.end(), [](const ChoiceState& c) { return c.done; });
              if (all_done) {
                if (state->request.include_usage) out += sse(usage_chunk(state->request, state->id, state->created, state->usage));
                out += "data: [DONE]\n\n";
              }
              if (out.empty()) {
                if (sink.is_writable()) return true;  // nothing yet; asked again
                for (const auto& stream : state->streams) stream->cancel();
                return false;
              }
              if (!sink.write(out.data(), out.size())) {
                for (const auto& stream : state->streams) stream->cancel();
                return false;
              }
              if (all_done) sink.done();
              return true;
            },
            [this, state](bool success) {
              if (!success)
                for (const auto& stream : state->streams) stream->cancel();  // the client left
              --open_streams_;
            });
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  };
  s.Post("/v1/completions", completion(Endpoint::Completions));
  s.Post("/v1/chat/completions", completion(Endpoint::ChatCompletions));
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json model = {{"id", options_.model_name}, {"object", "model"}, {"created", now_seconds()},
                        {"owned_by", "asynct"}, {"max_model_len", options_.context}};
    res.set_content(text_of(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  // 503 from the first moment of draining: a load balancer stops sending before the server closes.
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (worker_.draining())
      write_error(res, ApiError(503, "the server is shutting down"));
    else
      res.set_content(R"({"status":"ok"})", "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.prometheus_text(), "text/plain; version=0.0.4");
  });
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
  // httplib's own answers (no such route, a body over the limit) as OpenAI error objects.
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_) return;
    const std::string message = res.status == 404   ? "no route " + req.method + " " + req.path
                                : res.status == 413 ? "the request body is over the server's limit"
                                                    : "the request failed (HTTP " + std::to_string(res.status) + ")";
    send_error(res, ApiError(res.status, message));
  });
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const int port = options_.port == 0 ? server_->bind_to_any_port(options_.host)
                                      : (server_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  check(port > 0, "cannot listen on ", options_.host, ":", options_.port, " (in use, or not an address of this machine)");
  return port;
}

void HttpServer::listen() { server_->listen_after_bind(); }

void HttpServer::stop() { server_->stop(); }

}  // namespace asynct::serve
