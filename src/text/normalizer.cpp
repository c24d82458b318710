#include "text/normalizer.h"

#include <nlohmann/json.hpp>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include "core/error.h"
#include "text/utf8.h"

namespace asynct::text {

namespace {

void read_into(const nlohmann::json& spec, bool& nfc) {
  if (spec.is_null()) return;
  check(spec.is_object() && spec.contains("type") && spec["type"].is_string(),
        "tokenizer.json: the normalizer must be an object with a \"type\"");
  const std::string type = spec["type"];
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence") {
    check(spec.contains("normalizers") && spec["normalizers"].is_array(),
          "tokenizer.json: a Sequence normalizer needs a \"normalizers\" list");
    for (const auto& part : spec["normalizers"]) read_into(part, nfc);
  } else {
    throw Error("tokenizer.json: the normalizer type '" + type + "' is not supported (asynct implements NFC)");
  }
}

const icu::Normalizer2& nfc_instance() {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  check(U_SUCCESS(status) && n != nullptr, "ICU's NFC normalizer is unavailable: ", u_errorName(status));
  return *n;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& spec) {
  Normalizer n;
  read_into(spec, n.nfc_);
  if (n.nfc_) nfc_instance();  // fail at load, not at the first non-ASCII text
  return n;
}

bool Normalizer::normalize(std::string_view text, std::string& out) const {
  if (!nfc_ || is_ascii(text)) return false;
  check(text.size() < 0x7fffffffu, "NFC normalization: a text of ", text.size(),
        " bytes is past ICU's 2 GB limit");
  const icu::Normalizer2& nfc = nfc_instance();
  UErrorCode status = U_ZERO_ERROR;
  const icu::StringPiece piece(text.data(), int32_t(text.size()));
  if (nfc.isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return false;
  status = U_ZERO_ERROR;
  out.clear();
  icu::StringByteSink<std::string> sink(&out, int32_t(text.size()));
  nfc.normalizeUTF8(0, piece, sink, nullptr, status);
  check(U_SUCCESS(status), "NFC normalization failed: ", u_errorName(status));
  return true;
}

}  // namespace asynct::text
