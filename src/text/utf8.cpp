#include "text/utf8.h"

#include <cstring>

namespace asynct::text {

namespace {

// The second byte's range for a lead byte (RFC 3629's table: it rules out overlong forms,
// surrogates and code points above U+10FFFF); the later continuation bytes are 80..BF.
struct Lead {
  int length;  // 0: not a lead byte
  unsigned char lo, hi;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// How many bytes of s[i..] form a valid prefix of one sequence (>= 1 when s[i] is a lead
// byte), and the full length that sequence needs; valid = (prefix == need).
struct Scan {
  int prefix, need;
};

Scan scan_at(const unsigned char* s, std::size_t n, std::size_t i) {
  const Lead lead = lead_of(s[i]);
  if (lead.length == 0) return {0, 1};
  if (lead.length == 1) return {1, 1};
  int prefix = 1;
  for (int k = 1; k < lead.length && i + std::size_t(k) < n; ++k) {
    const unsigned char c = s[i + std::size_t(k)];
    const unsigned char lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (c < lo || c > hi) break;
    ++prefix;
  }
  return {prefix, lead.length};
}

constexpr char kReplacement[] = "\xEF\xBF\xBD";

}  // namespace

bool is_ascii(std::string_view s) {
  const char* p = s.data();
  std::size_t n = s.size(), i = 0;
  std::uint64_t acc = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc |= w;
  }
  for (; i < n; ++i) acc |= static_cast<unsigned char>(p[i]);
  return (acc & 0x8080808080808080ull) == 0;
}

std::optional<std::size_t> find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {  // skip ASCII eight bytes at a time
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const Scan sc = scan_at(p, n, i);
    if (sc.prefix != sc.need) return i;
    i += std::size_t(sc.need);
  }
  return std::nullopt;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int extra = b < 0x80 ? 0 : b < 0xE0 ? 1 : b < 0xF0 ? 2 : 3;
    char32_t cp = extra == 0 ? b : extra == 1 ? (b & 0x1F) : extra == 2 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k <= extra && i + std::size_t(k) < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + std::size_t(k)]) & 0x3F);
    out.push_back(cp);
    i += std::size_t(extra) + 1;
  }
  return out;
}

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[std::size_t(b)] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

int char_to_byte(char32_t cp) {
  static const std::array<std::int16_t, 512> inverse = [] {
    std::array<std::int16_t, 512> inv{};
    inv.fill(-1);
    const auto& fwd = byte_to_char();
    for (int b = 0; b < 256; ++b) inv[fwd[std::size_t(b)]] = std::int16_t(b);
    return inv;
  }();
  return cp < 512 ? inverse[cp] : -1;
}

void LossyUtf8Decoder::feed(std::string_view bytes, std::string& out) {
  std::size_t i = 0;
  // First complete (or settle) the sequence left over from the last call.
  while (pending_len_ > 0 && i < bytes.size()) {
    pending_[pending_len_++] = static_cast<unsigned char>(bytes[i++]);
    const Scan sc = scan_at(pending_, std::size_t(pending_len_), 0);
    if (sc.prefix == sc.need) {  // complete
      out.append(reinterpret_cast<const char*>(pending_), std::size_t(pending_len_));
      pending_len_ = 0;
    } else if (sc.prefix < pending_len_) {  // broken by the byte just added: replace the prefix
      out += kReplacement;
      const int keep = pending_len_ - sc.prefix;  // the bytes after the invalid prefix
      // Those bytes (only the newest one) start over: hand them back to the main loop.
      pending_len_ = 0;
      i -= std::size_t(keep);
    }
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t run = i;  // start of the valid run not yet appended
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Scan sc = scan_at(p, n, i);
    if (sc.prefix == sc.need) {
      i += std::size_t(sc.need);
      continue;
    }
    out.append(bytes.data() + run, i - run);
    if (i + std::size_t(sc.prefix) == n && sc.prefix > 0) {  // incomplete at the end: keep it
      std::memcpy(pending_, p + i, std::size_t(sc.prefix));
      pending_len_ = sc.prefix;
      return;
    }
    out += kReplacement;
    i += std::size_t(sc.prefix > 0 ? sc.prefix : 1);
    run = i;
  }
  out.append(bytes.data() + run, n - run);
}

void LossyUtf8Decoder::finish(std::string& out) {
  if (pending_len_ > 0) out += kReplacement;
  pending_len_ = 0;
}

std::string lossy_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  LossyUtf8Decoder d;
  d.feed(bytes, out);
  d.finish(out);
  return out;
}

}  // namespace asynct::text
