// UTF-8 helpers the tokenizer shares: validation of encode's input, the GPT-2 byte-level
// alphabet (each byte as one printable code point, how byte-level vocabularies spell bytes),
// and a lossy decoder that replaces invalid bytes the way Rust's String::from_utf8_lossy does
// (one U+FFFD per maximal invalid subpart), usable one chunk at a time for streaming.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace asynct::text {

// The byte offset of the first invalid UTF-8 sequence in `s` (overlong forms, surrogates and
// code points above U+10FFFF are invalid), or nullopt when `s` is valid.
std::optional<std::size_t> find_invalid_utf8(std::string_view s);

// True when every byte is below 0x80.
bool is_ascii(std::string_view s);

// Appends code point `cp` to `out` as UTF-8.
void append_utf8(std::string& out, char32_t cp);

// The code points of `s`, which must be valid UTF-8 (check with find_invalid_utf8 first).
std::u32string decode_utf8(std::string_view s);

// The byte-level alphabet: byte b <-> code point byte_to_char()[b]. Printable Latin-1 bytes map
// to themselves, the other 68 to U+0100 upwards, in byte order.
const std::array<char32_t, 256>& byte_to_char();
// The byte a byte-level code point stands for, or -1 when `cp` is not in the alphabet.
int char_to_byte(char32_t cp);

// Decodes bytes to valid UTF-8, replacing each maximal invalid subpart with U+FFFD. feed()
// appends what is complete and keeps an incomplete trailing sequence for the next call;
// finish() replaces a sequence still incomplete at the end. Feeding the bytes in any chunks
// gives the same text as feeding them at once.
class LossyUtf8Decoder {
 public:
  void feed(std::string_view bytes, std::string& out);
  void finish(std::string& out);
  bool pending() const { return pending_len_ > 0; }

 private:
  unsigned char pending_[4] = {};
  int pending_len_ = 0;
};

// Whole-buffer form of LossyUtf8Decoder.
std::string lossy_utf8(std::string_view bytes);

}  // namespace asynct::text
