// Structured output's constraint (serve/structured_output.h) on SmolLM2's tokenizer: walked by
// always taking the lowest allowed token, every mask allows a token and the constraint ends once
// the grammar has matched, with or without a stop token known (a model without an end-of-sequence
// token has none to take: its mask would be empty). Skipped without xgrammar or the tokenizer.
#include <gtest/gtest.h>

#include <bit>
#include <filesystem>

#include "engine/token_constraint.h"
#include "serve/structured_output.h"

namespace asynct::serve {
namespace {

TEST(StructuredOutput, ConstraintEndsOnceMatchedWithOrWithoutAStopToken) {
  if (!StructuredOutput::available()) GTEST_SKIP() << "built without xgrammar";
  const std::string tokenizer = std::string(ASYNCT_TEST_CACHE) + "/smollm2-135m-instruct/tokenizer.json";
  if (!std::filesystem::exists(tokenizer)) GTEST_SKIP() << "no tokenizer at " << tokenizer;
  const int vocab = 49152;
  for (const std::vector<std::int32_t>& stops : {std::vector<std::int32_t>{}, std::vector<std::int32_t>{2}}) {
    SCOPED_TRACE(stops.empty() ? "no stop token" : "stop token 2");
    const StructuredOutput structured(tokenizer, vocab, stops);
    for (const char* schema : {R"({"enum": ["x", "yes"]})", R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})"}) {
      SCOPED_TRACE(schema);
      const std::unique_ptr<TokenConstraint> c = structured.compile({ResponseFormat::Kind::JsonSchema, schema})();
      std::vector<std::uint32_t> words(std::size_t(token_mask_words(vocab)));
      int steps = 0;
      for (; steps < 64 && !c->complete(); ++steps) {
        std::fill(words.begin(), words.end(), 0u);
        c->fill_allowed(words.data(), vocab);
        int lowest = -1;
        for (std::size_t w = 0; w < words.size() && lowest < 0; ++w)
          if (words[w]) lowest = int(w) * 32 + std::countr_zero(words[w]);
        ASSERT_GE(lowest, 0) << "step " << steps << ": the mask allows no token";
        // A stop token is the end: the grammar has matched.
        ASSERT_TRUE(c->accept(lowest)) << "token " << lowest;
      }
      EXPECT_TRUE(c->complete()) << "not complete after " << steps << " tokens";
      EXPECT_LT(steps, 64);
    }
  }
}

}  // namespace
}  // namespace asynct::serve
