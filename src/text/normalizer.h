// tokenizer.json's "normalizer": none, NFC, or a Sequence of those. Any other type is an Error
// naming it (never approximated).
//
// NFC comes from ICU's Normalizer2 (Debian libicu-dev), not utf8proc: ICU normalizes UTF-8 in
// place of UTF-16 round trips (normalizeUTF8), has a quick check that answers "already NFC"
// for almost all real text without building a copy, follows the current Unicode version, and
// is on every Debian image already; utf8proc would be a second Unicode table for the same job.
// ASCII text is NFC by definition and skips ICU entirely.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace asynct::text {

class Normalizer {
 public:
  Normalizer() = default;  // the identity
  // Reads tokenizer.json's "normalizer" value (null: the identity).
  static Normalizer from_json(const nlohmann::json& spec);

  bool is_identity() const { return !nfc_; }
  // Writes the normalized `text` to `out` and returns true, or returns false when `text` is
  // already normalized (out untouched). `text` must be valid UTF-8.
  bool normalize(std::string_view text, std::string& out) const;

 private:
  bool nfc_ = false;
};

}  // namespace asynct::text
