#include "jobs/warm_up.h"

#include <algorithm>

namespace asynct {

void warm_up_engine(Engine& engine, const WarmUp& w, int vocab_size) {
  for (int i = 0; i < w.requests; ++i) {
    Request r;
    r.prompt.reserve(std::size_t(w.prompt_tokens));
    for (int t = 0; t < w.prompt_tokens; ++t) r.prompt.push_back((i * 31 + t * 7 + 1) % vocab_size);
    r.max_tokens = w.output_tokens;
    if (w.sampling) r.sampling = w.sampling(i);
    engine.add_request(r);
  }
  engine.run_to_completion();
  engine.reset_stats();
}

WarmUp server_warm_up(int step_tokens, int max_num_seqs, int context, long long cache_tokens) {
  WarmUp w;
  w.output_tokens = 4;
  const int slack = w.output_tokens + 1;  // a request's tokens beyond its prompt, and a draft's
  w.prompt_tokens = std::max(1, std::min({1024, step_tokens, context - slack}));
  w.requests = std::clamp(step_tokens / w.prompt_tokens, 1, max_num_seqs);
  // Within the cache: fewer requests, then shorter prompts.
  while (w.requests > 1 && (long long)w.requests * (w.prompt_tokens + slack) > cache_tokens) --w.requests;
  w.prompt_tokens = int(std::max(1LL, std::min<long long>(w.prompt_tokens, cache_tokens - slack)));
  w.sampling = [](int i) {
    SamplingParams p;
    if (i % 2 == 1) {
      p.temperature = 0.8f;
      p.top_p = 0.9f;
      p.seed = std::uint64_t(i);
    }
    return p;
  };
  return w;
}

}  // namespace asynct
