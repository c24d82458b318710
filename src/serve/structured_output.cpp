#include "serve/structured_output.h"

#include <algorithm>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/openai_api.h"
#include "text/tool_prompt.h"

#ifdef ASYNCT_WITH_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace asynct::serve {

#ifdef ASYNCT_WITH_XGRAMMAR

namespace {

// Each id's token as tokenizer.json spells it (byte-level: "Ġ" for a space), "" for ids it lacks.
std::vector<std::string> encoded_vocab(const std::string& path, int vocab_size) {
  std::ifstream in(path);
  check(in.good(), "structured output: cannot read ", path);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<std::string> vocab(static_cast<std::size_t>(vocab_size));
  const auto put = [&](std::int64_t id, const std::string& token) {
    if (id >= 0 && id < vocab_size) vocab[std::size_t(id)] = token;
  };
  for (const auto& [token, id] : j.at("model").at("vocab").items()) put(id.get<std::int64_t>(), token);
  if (j.contains("added_tokens"))
    for (const auto& t : j["added_tokens"]) put(t.at("id").get<std::int64_t>(), t.at("content").get<std::string>());
  return vocab;
}

class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(const xgrammar::CompiledGrammar& grammar, int vocab_size, std::vector<std::int32_t> stop_ids)
      : matcher_(grammar), bitmask_(std::size_t(xgrammar::GetBitmaskSize(vocab_size))), stop_ids_(std::move(stop_ids)) {}
  void fill_allowed(std::uint32_t* words, int vocab) override {
    if (!filled_) fill_next();
    filled_ = false;
    const std::size_t n = std::min(bitmask_.size(), std::size_t(token_mask_words(vocab)));
    for (std::size_t i = 0; i < n; ++i) words[i] = std::uint32_t(bitmask_[i]);
  }
  bool accept(std::int32_t token) override {
    filled_ = false;
    return matcher_.AcceptToken(token);
  }
  // The stop token taken; or the grammar matched and nothing but a stop token may follow: a
  // model without an end-of-sequence token (or a request that ignores it) has none to take, and
  // its mask would allow no token at all.
  bool complete() const override {
    if (matcher_.IsTerminated()) return true;
    if (!matcher_.IsCompleted()) return false;
    fill_next();  // (kept for the next fill_allowed)
    std::vector<std::int32_t> words(bitmask_);
    for (const std::int32_t id : stop_ids_)
      if (id >= 0 && std::size_t(id / 32) < words.size()) words[std::size_t(id / 32)] &= ~std::int32_t(1u << (id % 32));
    return std::all_of(words.begin(), words.end(), [](std::int32_t w) { return w == 0; });
  }

 private:
  void fill_next() const {
    std::int64_t shape[1] = {std::int64_t(bitmask_.size())};
    DLTensor t{};
    t.data = bitmask_.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = shape;
    matcher_.FillNextTokenBitmask(&t);
    filled_ = true;
  }

  // complete() looks at the next mask, which fill_allowed then takes as it is.
  mutable xgrammar::GrammarMatcher matcher_;
  mutable std::vector<std::int32_t> bitmask_;
  mutable bool filled_ = false;
  std::vector<std::int32_t> stop_ids_;
};

}  // namespace

struct StructuredOutput::Impl {
  Impl(const std::string& path, int vocab_size, std::vector<std::int32_t> stop_ids)
      : vocab_size(vocab_size),
        info(encoded_vocab(path, vocab_size), xgrammar::VocabType::BYTE_LEVEL, vocab_size, std::move(stop_ids)),
        compiler(info, 2) {}
  int vocab_size;
  xgrammar::TokenizerInfo info;
  mutable xgrammar::GrammarCompiler compiler;  // thread-safe, with its own cache

  TokenConstraintFactory factory(const xgrammar::CompiledGrammar& grammar) const {
    return [grammar, vocab = vocab_size, stops = info.GetStopTokenIds()] { return std::make_unique<GrammarConstraint>(grammar, vocab, stops); };
  }
};

StructuredOutput::StructuredOutput(const std::string& tokenizer_json, int vocab_size, std::vector<std::int32_t> stop_ids)
    : impl_(std::make_unique<Impl>(tokenizer_json, vocab_size, std::move(stop_ids))) {}

bool StructuredOutput::available() { return true; }

TokenConstraintFactory StructuredOutput::compile(const ResponseFormat& format) const {
  std::optional<xgrammar::CompiledGrammar> grammar;
  try {
    // Compact JSON (no free whitespace: a model could pad it without end); json_object is any
    // object, its properties not limited (strict mode off).
    const bool schema = format.kind == ResponseFormat::Kind::JsonSchema;
    grammar = impl_->compiler.CompileJSONSchema(schema ? format.schema : R"({"type": "object"})", /*any_whitespace=*/false,
                                                std::nullopt, std::nullopt, /*strict_mode=*/schema);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("response_format: the schema cannot be compiled: ") + e.what(), "response_format");
  }
  return impl_->factory(*grammar);
}

TokenConstraintFactory StructuredOutput::compile_tool_call(const std::string& call_schema) const {
  std::optional<xgrammar::CompiledGrammar> grammar;
  try {
    const auto literal = [](std::string_view text) {
      std::string ebnf = "root ::= \"";
      for (const char c : text) {
        if (c == '\n' || c == '"' || c == '\\') ebnf += '\\';
        ebnf += c == '\n' ? 'n' : c;
      }
      return xgrammar::Grammar::FromEBNF(ebnf + "\"");
    };
    const xgrammar::Grammar call = xgrammar::Grammar::Concat(
        {literal(std::string(text::kToolCallOpen) + "\n"),
         xgrammar::Grammar::FromJSONSchema(call_schema, /*any_whitespace=*/false, std::nullopt, std::nullopt, /*strict_mode=*/true),
         literal("\n" + std::string(text::kToolCallClose))});
    grammar = impl_->compiler.CompileGrammar(call);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("tools: a function's parameters cannot be compiled: ") + e.what(), "tools");
  }
  return impl_->factory(*grammar);
}

#else  // no xgrammar

struct StructuredOutput::Impl {};

StructuredOutput::StructuredOutput(const std::string&, int, std::vector<std::int32_t>) {}

bool StructuredOutput::available() { return false; }

namespace {
ApiError no_grammar(const std::string& field) {
  return ApiError(400,
                  field + ": this server was built without xgrammar, so structured output is not available "
                          "(scripts/fetch_grammar_assets.sh, then rebuild)",
                  field);
}
}  // namespace

TokenConstraintFactory StructuredOutput::compile(const ResponseFormat&) const { throw no_grammar("response_format"); }

TokenConstraintFactory StructuredOutput::compile_tool_call(const std::string&) const { throw no_grammar("tool_choice"); }

#endif

StructuredOutput::~StructuredOutput() = default;

}  // namespace asynct::serve
