// What structured output costs the host at each step: 32 sequences under bench_serve.py's JSON
// schema, each taking a random allowed token a step (as a random-weight model does), timed per
// row for the allowed-token mask (TokenConstraint::fill_allowed) and for taking the token
// (accept), and per step for the 32 masks on one thread and on the engine's pool.
//
// Usage: build/<dir>/bench/asynct_bench_structured_output TOKENIZER_JSON VOCAB_SIZE [STEPS]
//   e.g. a Qwen3 tokenizer.json and 151936.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/token_constraint.h"
#include "serve/structured_output.h"

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// bench_serve.py's --response-format json_schema.
constexpr const char* kSchema = R"({"type": "object",
  "properties": {"title": {"type": "string"}, "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
                 "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 8},
                 "summary": {"type": "string"}},
  "required": ["title", "year", "tags", "summary"], "additionalProperties": false})";

}  // namespace

int main(int argc, char** argv) {
  using namespace asynct;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON VOCAB_SIZE [STEPS]\n", argv[0]);
    return 2;
  }
  const int vocab = std::atoi(argv[2]), steps = argc > 3 ? std::atoi(argv[3]) : 256;
  constexpr int kRows = 32;
  serve::StructuredOutput so(argv[1], vocab, {});
  const TokenConstraintFactory factory = so.compile({serve::ResponseFormat::Kind::JsonSchema, kSchema});
  const int words = token_mask_words(vocab);

  std::vector<std::unique_ptr<TokenConstraint>> rows(kRows);
  for (auto& r : rows) r = factory();
  std::vector<std::uint32_t> masks(std::size_t(kRows) * words);
  std::mt19937 rng(1);
  std::vector<double> fill_us, accept_us, serial_step_us, pool_step_us;
  ThreadPool pool;
  // A random allowed token of a row's mask; a finished row starts over.
  const auto take = [&](int r) {
    const std::uint32_t* m = masks.data() + std::size_t(r) * words;
    int allowed = 0;
    for (int w = 0; w < words; ++w) allowed += std::popcount(m[w]);
    int pick = int(rng() % std::uint32_t(allowed));
    for (int t = 0; t < vocab; ++t)
      if ((m[t / 32] >> (t % 32) & 1u) && pick-- == 0) {
        const auto t0 = Clock::now();
        const bool ok = rows[std::size_t(r)]->accept(t);
        accept_us.push_back(us_since(t0));
        if (!ok) std::fprintf(stderr, "accept refused token %d\n", t), std::exit(1);
        break;
      }
    if (rows[std::size_t(r)]->complete()) rows[std::size_t(r)] = factory();
  };
  for (int step = 0; step < steps; ++step) {
    std::fill(masks.begin(), masks.end(), 0u);
    const bool on_pool = step % 2 == 1;
    const auto t0 = Clock::now();
    if (on_pool) {
      pool.run(kRows, [&](std::size_t r) { rows[r]->fill_allowed(masks.data() + r * words, vocab); });
      pool_step_us.push_back(us_since(t0));
    } else {
      for (int r = 0; r < kRows; ++r) {
        const auto t1 = Clock::now();
        rows[std::size_t(r)]->fill_allowed(masks.data() + std::size_t(r) * words, vocab);
        fill_us.push_back(us_since(t1));
      }
      serial_step_us.push_back(us_since(t0));
    }
    for (int r = 0; r < kRows; ++r) take(r);
  }
  std::printf("structured output, %d rows, vocab %d, %d steps (bench_serve's JSON schema, random allowed tokens)\n",
              kRows, vocab, steps);
  std::printf("  per row: mask %.1f us, accept %.1f us (medians)\n", median(fill_us), median(accept_us));
  std::printf("  a step's %d masks: %.1f us on one thread, %.1f us on %u threads (medians)\n", kRows,
              median(serial_step_us), median(pool_step_us), pool.size());
  return 0;
}
