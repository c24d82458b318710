#include "text/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace asynct::text {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

PreTokenizer PreTokenizer::from_json(const nlohmann::json& spec) {
  PreTokenizer p;
  if (!spec.is_null()) p.read(spec);
  return p;
}

void PreTokenizer::read(const nlohmann::json& spec) {
  check(spec.is_object() && spec.contains("type") && spec["type"].is_string(),
        "tokenizer.json: a pre_tokenizer must be an object with a \"type\"");
  const std::string type = spec["type"];
  if (type == "Sequence") {
    check(spec.contains("pretokenizers") && spec["pretokenizers"].is_array(),
          "tokenizer.json: a Sequence pre_tokenizer needs a \"pretokenizers\" list");
    for (const auto& part : spec["pretokenizers"]) read(part);
  } else if (type == "Split") {
    check(spec.contains("pattern") && spec["pattern"].is_object(), "tokenizer.json: a Split pre_tokenizer needs a \"pattern\"");
    const auto& pattern = spec["pattern"];
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regexes_.emplace_back(pattern["Regex"].get<std::string>());
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      regexes_.emplace_back(pattern["String"].get<std::string>(), /*literal=*/true);
    } else {
      throw Error("tokenizer.json: a Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
    check(!spec.value("invert", false), "tokenizer.json: Split with invert = true is not supported");
    const std::string behavior = spec.value("behavior", std::string("Isolated"));
    Step step{Step::kSplitIsolated, &regexes_.back()};
    if (behavior == "Removed") {
      step.kind = Step::kSplitRemoved;
    } else {
      check(behavior == "Isolated", "tokenizer.json: the Split behavior '", behavior,
            "' is not supported (asynct implements Isolated and Removed)");
    }
    steps_.push_back(step);
  } else if (type == "Digits") {
    // The reference splits on char::is_numeric (general categories Nd, Nl, No: \p{N}), each
    // digit Isolated, or runs of them (Contiguous) when individual_digits is false.
    const nlohmann::json individual = spec.value("individual_digits", nlohmann::json(false));
    check(individual.is_boolean(), "tokenizer.json: Digits' individual_digits must be true or false");
    regexes_.emplace_back(individual.get<bool>() ? R"(\p{N})" : R"(\p{N}+)");
    steps_.push_back(Step{Step::kSplitIsolated, &regexes_.back()});
  } else if (type == "ByteLevel") {
    Step step{Step::kByteLevel};
    step.add_prefix_space = spec.value("add_prefix_space", true);
    if (spec.value("use_regex", true)) {
      regexes_.emplace_back(kGpt2Pattern);
      step.regex = &regexes_.back();
    }
    // With neither a prefix nor a split it only maps bytes to characters, which BpeModel's
    // byte ids already do: no step.
    if (step.add_prefix_space || step.regex) steps_.push_back(step);
  } else {
    throw Error("tokenizer.json: the pre_tokenizer type '" + type +
                "' is not supported (asynct implements Sequence, Split, Digits and ByteLevel)");
  }
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words,
                         std::deque<std::string>& scratch) const {
  if (text.empty()) return;
  const std::size_t first = words.size();
  words.push_back(text);
  thread_local std::vector<Span> spans;
  thread_local std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::size_t w = first; w < words.size(); ++w) {
      std::string_view word = words[w];
      if (step.kind == Step::kByteLevel && step.add_prefix_space && word.front() != ' ') {
        std::string& prefixed = scratch.emplace_back();
        prefixed.reserve(word.size() + 1);
        prefixed.push_back(' ');
        prefixed.append(word);
        word = prefixed;
      }
      if (!step.regex) {
        next.push_back(word);
        continue;
      }
      spans.clear();
      step.regex->find_all(word, spans);
      // Both behaviours keep the text between matches as words of their own.
      const bool keep_matches = step.kind != Step::kSplitRemoved;
      std::size_t at = 0;
      for (const Span& s : spans) {
        if (s.begin > at) next.push_back(word.substr(at, s.begin - at));
        if (keep_matches) next.push_back(word.substr(s.begin, s.end - s.begin));
        at = s.end;
      }
      if (at < word.size()) next.push_back(word.substr(at));
    }
    words.resize(first);
    words.insert(words.end(), next.begin(), next.end());
  }
}

}  // namespace asynct::text
