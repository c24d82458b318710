// A request's constraint on the tokens it may generate (structured output): before each of the
// request's rows the engine asks it which tokens may come next (a bitmask the sampler applies),
// and tells it every token the request takes; once it is complete the request ends ("stop").
// One object per sequence, made by Request::constraint; the engine calls it from step() only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace asynct {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets bit (t % 32) of words[t / 32] for every token t allowed next; `words` holds
  // (vocab + 31) / 32 words, all zero on entry. At least one token must be allowed.
  virtual void fill_allowed(std::uint32_t* words, int vocab) = 0;
  // The request took `token` (one the last mask allowed); false: the constraint cannot take it.
  virtual bool accept(std::int32_t token) = 0;
  // Nothing more may follow: the request ends with finish_reason "stop".
  virtual bool complete() const = 0;
};

using TokenConstraintFactory = std::function<std::unique_ptr<TokenConstraint>()>;

constexpr int token_mask_words(int vocab) { return (vocab + 31) / 32; }

}  // namespace asynct
