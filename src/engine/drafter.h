// Drafts for speculative decoding: tokens a decoding sequence is likely to continue with,
// proposed without running the model. The engine (engine.h) feeds a sequence's newest token and
// its drafts to one step, takes the model's token at every position, and keeps the drafts up to
// the first the model did not choose (that position's own token follows them): each token kept
// is the one the model gives at its position, drawn with its own draw index, so the output is
// the same, greedy or sampled, as without drafts wherever the arithmetic does not depend on the
// batch (the CPU backend).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace asynct {

struct SpeculativeOptions {
  // none, ngram (prompt lookup), suffix (suffix decoding, engine/suffix_index.h), draft (a draft
  // model's greedy tokens, engine/draft_model.h: the engine is given its runner), or forced
  // (`asynct bench` only: every step drafts num_tokens copies of the newest token and keeps them
  // all, whatever the model draws, so that verification is timed apart from the model's luck;
  // its outputs are not the model's).
  std::string method = "none";
  int num_tokens = 4;           // drafted tokens a step at most (--speculative-tokens)
  int ngram_min = 1, ngram_max = 4;  // prompt lookup's match lengths
  // Suffix decoding: the index's longest window (a match and the token after it), the share of its
  // path's count a drafted token needs, the tokens of finished requests the engine keeps to
  // draft from (0: each request drafts from its own tokens only), and the newest tokens of its
  // own a request's index keeps. An index holds up to depth trie nodes a token (~130 bytes
  // each): the default cache's worst case is ~200 MB, a drafting request's own ~13 MB.
  int suffix_depth = 24;
  double suffix_min_probability = 0.1;
  std::int64_t suffix_cache_tokens = std::int64_t(1) << 16;
  std::int64_t suffix_request_tokens = 4096;
  // When drafting stops (it costs more than it gives): a step drafts only while at most
  // max_batch sequences run (0: any number; each draft is one more row of every product, and a
  // large batch's rows are no longer free); and a sequence whose round of drafts kept none does
  // not draft for its next 1, 2, 4, ... decode steps, up to max_pause (0: never), until a round
  // keeps one [S2].
  int max_batch = 8;
  int max_pause = 16;
  // --draft-model: the checkpoint directory of --speculative draft's model, which the commands
  // load (make_draft_model, models/runner_factory.h) and hand to the engine.
  std::string draft_model = "";
  bool enabled() const { return method != "none"; }
  bool forced() const { return method == "forced"; }
};

// Throws Error naming the option: an unknown method (forced only when allow_forced), num_tokens outside 1..64, ngram lengths
// outside 1..64 or min over max, suffix depth outside 2..64, min probability outside [0, 1],
// cached tokens outside 0..2^30, a request's own tokens outside 1..2^30, max_batch outside
// 0..2^20, max_pause outside 0..2^20.
void validate_speculative(const SpeculativeOptions& options, bool allow_forced = false);

// Prompt lookup over `tokens` (a sequence's prompt and output): for n from max_n down to min_n,
// the most recent earlier occurrence of its last n tokens; the tokens that followed it there,
// at most max_tokens of them (fewer where the sequence ends first). Empty when none occurs.
std::vector<std::int32_t> ngram_draft(std::span<const std::int32_t> tokens, int min_n, int max_n, int max_tokens);

}  // namespace asynct
