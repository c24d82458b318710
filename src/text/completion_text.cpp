#include "text/completion_text.h"

#include <algorithm>

#include "core/error.h"
#include "text/utf8.h"

namespace asynct::text {

CompletionText::CompletionText(const Tokenizer& tokenizer, std::vector<std::string> stop_strings, bool skip_special)
    : detokenizer_(tokenizer, skip_special), tokenizer_(&tokenizer), stop_strings_(std::move(stop_strings)) {
  for (std::size_t i = 0; i < stop_strings_.size(); ++i) {
    check(!stop_strings_[i].empty(), "stop string ", i, " is empty");
    const auto bad = find_invalid_utf8(stop_strings_[i]);
    check(!bad, "stop string ", i, " is not valid UTF-8 (byte ", bad.value_or(0), ")");
  }
}

const std::string& CompletionText::stop_string() const {
  static const std::string none;
  return stop_index_ >= 0 ? stop_strings_[std::size_t(stop_index_)] : none;
}

std::string CompletionText::push(std::int32_t id) {
  if (stopped() || finished_ || !tokenizer_->has_token(id)) return {};
  pending_ += detokenizer_.push(id);
  return release();
}

std::string CompletionText::finish() {
  if (stopped() || finished_) return {};
  finished_ = true;
  pending_ += detokenizer_.finish();
  // The held-back beginning of a stop string can still complete a stop string together with
  // the bytes the detokenizer held (U+FFFD for a character the generation left unfinished).
  std::string out = release();
  if (!stopped()) out += pending_;
  pending_.clear();
  return out;
}

std::string CompletionText::release() {
  // The first stop string in the pending text (the one that starts first; the earlier in the
  // list on a tie). Both are valid UTF-8, so a match starts on a character boundary.
  std::size_t first = std::string::npos;
  for (std::size_t i = 0; i < stop_strings_.size(); ++i) {
    const std::size_t at = pending_.find(stop_strings_[i]);
    if (at < first) first = at, stop_index_ = int(i);
  }
  if (first != std::string::npos) {
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that begins some stop string (shorter than it: a whole one
  // would have matched above). It starts with a stop string's first byte, never a UTF-8
  // continuation byte, so the text shown ends on a character boundary.
  std::size_t hold = 0;
  for (const std::string& stop : stop_strings_) {
    for (std::size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

}  // namespace asynct::text
