// The completion routes (POST /v1/completions, /v1/chat/completions): a checked request's
// prompts to ids, its choices to the engine worker, and their tokens back as one JSON body or
// as Server-Sent Events. Choice j of prompt i is index i * n + j and draws with seed + j.
#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>

#include "core/error.h"
#include "serve/http_server.h"
#include "serve/http_util.h"
#include "serve/structured_output.h"

namespace asynct::serve {
namespace {

using json = nlohmann::ordered_json;
using namespace std::chrono_literals;

// A streaming response's state, shared by its content provider and its releaser.
struct ChoiceState {
  bool first = true;             // no chunk sent yet
  bool done = false;             // its last chunk sent
  std::int64_t token_bytes = 0;  // the bytes of the tokens whose logprobs were sent
  std::optional<ToolCallReader> calls;  // with tools: the answer read for calls as it streams
  int calls_sent = 0;
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
  bool output = false;                                  // a token has come

  void cancel() {
    for (const auto& stream : streams) stream->cancel();
  }
  void take(std::size_t i, StreamEvent& event) {
    Choice& choice = choices[i];
    output = output || !event.text.empty() || !event.tokens.empty() || event.completion_tokens > 0;
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
    if (request.tools.read_calls()) {
      AnswerPart answer = read_tool_calls(choice.text);
      choice.text = std::move(answer.content);
      choice.tool_calls = std::move(answer.calls);
    }
    choice.finish_reason = openai_finish_reason(event.finish_reason, !choice.tool_calls.empty());
    choice.logprobs = logprobs_of(tokens[i]);
    usage.completion_tokens += event.completion_tokens;
    if (i % std::size_t(request.n) == 0) usage.cached_tokens += event.cached_tokens;  // each prompt's, once: its first choice's
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

}  // namespace

void HttpServer::complete(Endpoint endpoint, const std::string& body, httplib::Response& res) {
  CompletionRequest r = parse_completion_request(endpoint, body, options_.model_name);
  r.system_fingerprint = options_.system_fingerprint;
  const bool chat = endpoint == Endpoint::ChatCompletions;
  const char* prompt_field = chat ? "messages" : "prompt";
  const std::size_t prompts = chat ? 1 : r.prompts.size();
  const std::size_t choices = prompts * std::size_t(r.n);
  // n choices of each prompt: n requests of one prompt, seeds seed, seed + 1, ...
  if (choices > std::size_t(worker_.max_in_flight()))
    throw ApiError(400, std::to_string(prompts) + " prompt(s) of n = " + std::to_string(r.n) + " choices are " +
                            std::to_string(choices) + " requests; this server takes " +
                            std::to_string(worker_.max_in_flight()) + " at once", prompts > 1 ? "prompt" : "n");
  for (const LogitBias& b : r.logit_bias)
    if (b.id >= options_.vocab_size)
      throw ApiError(400, "logit_bias: token id " + std::to_string(b.id) + " is outside the vocabulary [0, " +
                              std::to_string(options_.vocab_size) + ")", "logit_bias");
  TokenConstraintFactory constraint;  // structured output: one constraint per choice
  if (r.response_format.kind != ResponseFormat::Kind::Text) {
    if (!options_.structured_output)
      throw ApiError(400, "response_format: this server has no structured output", "response_format");
    constraint = options_.structured_output->compile(r.response_format);
  }
  if (r.tools.forced()) {  // one call, its arguments valid for the function's schema
    if (!options_.structured_output)
      throw ApiError(400, "tool_choice: this server has no structured output to force a call with", "tool_choice");
    constraint = options_.structured_output->compile_tool_call(forced_call_schema(r.tools));
  }
  std::vector<std::vector<std::int32_t>> ids(prompts);
  std::vector<std::unique_ptr<OutputText>> outs;  // each choice's text
  {
    const std::lock_guard<std::mutex> lock(text_mutex_);
    try {
      if (chat) {
        if (!text_.has_chat_template()) throw ApiError(400, "this model has no chat template: use /v1/completions", "messages");
        ids[0] = text_.chat_ids(r.messages, r.tools.tools);
      } else {
        for (std::size_t p = 0; p < prompts; ++p)
          ids[p] = r.prompts[p].ids.empty() ? text_.prompt_ids(r.prompts[p].text, "prompt") : r.prompts[p].ids;
      }
      for (std::size_t i = 0; i < choices; ++i) outs.push_back(text_.output(r.stop));
    } catch (const Error& e) {
      throw ApiError(400, e.what(), prompt_field);
    }
  }
  std::int64_t prompt_tokens = 0;
  std::vector<Request> requests(choices);
  for (std::size_t p = 0; p < prompts; ++p) {
    const std::string which = prompts > 1 ? "prompt " + std::to_string(p) : "the prompt";
    if (ids[p].empty()) throw ApiError(400, which + " is empty", prompt_field);
    for (const std::int32_t id : ids[p])
      if (id >= options_.vocab_size)
        throw ApiError(400, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(options_.vocab_size) + ")", "prompt");
    const std::int64_t prompt = std::int64_t(ids[p].size());
    prompt_tokens += prompt;
    if (prompt >= options_.context)
      throw ApiError(400, which + " is " + std::to_string(prompt) + " tokens; the model's context is " +
                              std::to_string(options_.context) + " tokens (prompt and output together)", prompt_field);
    const std::int64_t max_tokens = r.max_tokens > 0 ? r.max_tokens : options_.context - prompt;
    if (prompt + max_tokens > options_.context)
      throw ApiError(400, which + " (" + std::to_string(prompt) + " tokens) and max_tokens (" + std::to_string(max_tokens) +
                              ") are over the model's context of " + std::to_string(options_.context) + " tokens",
                     "max_tokens");
    for (int j = 0; j < r.n; ++j) {
      Request& er = requests[p * std::size_t(r.n) + std::size_t(j)];
      er.prompt = ids[p];
      er.max_tokens = int(max_tokens);
      er.sampling = r.sampling;
      er.sampling.seed = r.sampling.seed + std::uint64_t(j);
      er.logit_bias = r.logit_bias;
      er.constraint = constraint;
      if (!r.ignore_eos) er.eos_token_ids = options_.eos_token_ids;
    }
  }
  log_tokens(prompt_tokens, 0);
  // One group a prompt (its choices fork after it), all or none.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (std::size_t p = 0; p < prompts; ++p) {
    const auto first = std::ptrdiff_t(p) * r.n, last = first + r.n;
    std::vector<Request> group(std::make_move_iterator(requests.begin() + first), std::make_move_iterator(requests.begin() + last));
    std::vector<std::unique_ptr<OutputText>> texts(std::make_move_iterator(outs.begin() + first),
                                                   std::make_move_iterator(outs.begin() + last));
    std::vector<std::shared_ptr<RequestStream>> got = worker_.submit_group(std::move(group), std::move(texts));
    if (got.empty()) {
      for (const auto& stream : streams) stream->cancel();
      if (worker_.draining()) throw ApiError(503, "the server is shutting down");
      if (const std::string failure = worker_.failure(); !failure.empty())
        throw ApiError(503, "the engine failed and takes no more requests (restart the server): " + failure);
      throw ApiError(429, "the server is busy: too many requests at once; try again");
    }
    streams.insert(streams.end(), got.begin(), got.end());
  }

  const std::string id = next_id(chat ? "chatcmpl-" : "cmpl-");
  const std::int64_t created = now_seconds();
  if (!r.stream) {
    // Refused by the engine: an error status. Taken: the response comes through a content
    // provider that also sends a space (JSON allows leading whitespace) every second while the
    // choices run: a write that fails means the client has left, and its choices end.
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
    whole->usage.prompt_tokens = prompt_tokens;
    whole->id = id;
    whole->created = created;
    whole->request = std::move(r);
    whole->last_write = std::chrono::steady_clock::now();
    ++open_streams_;
    res.set_chunked_content_provider(
        "application/json",
        [this, whole](std::size_t, httplib::DataSink& sink) {
          const bool more = whole->provide(sink);
          if (whole->output) log_first_output();
          log_tokens(whole->usage.prompt_tokens, whole->usage.completion_tokens);
          return more;
        },
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
  if (state->request.tools.read_calls())
    for (ChoiceState& c : state->choices) c.calls.emplace();
  state->id = id;
  state->created = created;
  state->usage.prompt_tokens = prompt_tokens;
  // One event of choice i as SSE: a text chunk, or its last chunk (an error object when it failed).
  const auto chunk_text = [this](StreamState& st, std::size_t i, const StreamEvent& event) {
    ChoiceState& c = st.choices[i];
    // With tools, the text read for calls: what is safe to send now, and the calls completed.
    AnswerPart part{event.text, {}};
    if (c.calls && event.error.empty()) part = c.calls->push(event.text, event.done);
    const int calls_before = c.calls_sent;
    c.calls_sent += int(part.calls.size());
    std::string text;
    if (!event.done) {
      const std::vector<TokenLogprob> logprobs = logprobs_of(event.tokens);
      text = sse(completion_chunk(st.request, st.id, st.created, part.content, "", c.first, logprobs, c.token_bytes, int(i),
                                  part.calls, calls_before));
      for (const TokenLogprob& t : logprobs) c.token_bytes += std::int64_t(t.token.size());
      c.first = false;
    } else if (!event.error.empty()) {
      text = sse(error_body(ApiError(500, event.error)));
      c.done = true;
    } else {
      st.usage.completion_tokens += event.completion_tokens;
      // Each prompt's cached tokens, once: its first choice's.
      if (i % std::size_t(st.request.n) == 0) st.usage.cached_tokens += event.cached_tokens;
      text = sse(completion_chunk(st.request, st.id, st.created, part.content,
                                  openai_finish_reason(event.finish_reason, c.calls_sent > 0), c.first, {}, c.token_bytes,
                                  int(i), part.calls, calls_before));
      c.done = true;
    }
    return text;
  };
  res.set_header("Cache-Control", "no-cache");
  ++open_streams_;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, state, chunk_text](std::size_t, httplib::DataSink& sink) {
        // Every choice's events that are ready, in choice order; when none is, a short wait on
        // the first unfinished one.
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
          log_tokens(state->usage.prompt_tokens, state->usage.completion_tokens);
        }
        if (!out.empty()) log_first_output();
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
}

}  // namespace asynct::serve
