// Pre-tokenizer regexes of GPT-2-style byte-level BPE, matched by hand over code points (the alternatives are tried in
// order at each position, first match wins, exactly as a backtracking regex engine would):
//   gpt2:    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   smollm:  \p{N} isolated first (each number code point is its own piece), then gpt2 on each remaining run; the
//            lookahead sees the end of that run as the end of the text (llama.cpp applies its regexes in sequence to
//            the pieces of the previous one; Hugging Face runs ByteLevel on the pieces of Digits).
// Character classes come from ICU (Unicode general categories L* / N*, White_Space property).
#include "engine/pretokenize.hpp"

#include <unicode/uchar.h>

namespace flashkv::engine_detail {

namespace {

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

struct Unit {
  std::size_t begin, end;  // bytes
  int32_t cp;              // code point, −1 for a byte that is not part of valid UTF-8
  CharClass cls;
};

/// Decodes one well-formed UTF-8 sequence at text[i] (RFC 3629: no overlongs, no surrogates, <= U+10FFFF); returns
/// its length and sets cp, or returns 0 when the byte does not start a valid sequence.
std::size_t utf8_decode(std::string_view s, std::size_t i, int32_t& cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) { cp = b0; return 1; }
  std::size_t len;
  uint32_t c, lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) { len = 2; c = b0 & 0x1F; }
  else if (b0 >= 0xE0 && b0 <= 0xEF) { len = 3; c = b0 & 0x0F; if (b0 == 0xE0) lo = 0xA0; if (b0 == 0xED) hi = 0x9F; }
  else if (b0 >= 0xF0 && b0 <= 0xF4) { len = 4; c = b0 & 0x07; if (b0 == 0xF0) lo = 0x90; if (b0 == 0xF4) hi = 0x8F; }
  else return 0;
  if (i + len > s.size()) return 0;
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    c = (c << 6) | (b & 0x3F);
  }
  cp = static_cast<int32_t>(c);
  return len;
}

CharClass classify(int32_t cp) {
  if (cp < 0) return kOther;
  if (u_hasBinaryProperty(cp, UCHAR_WHITE_SPACE)) return kSpace;
  switch (u_charType(cp)) {
    case U_UPPERCASE_LETTER: case U_LOWERCASE_LETTER: case U_TITLECASE_LETTER: case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return kLetter;
    case U_DECIMAL_DIGIT_NUMBER: case U_LETTER_NUMBER: case U_OTHER_NUMBER:
      return kNumber;
    default:
      return kOther;
  }
}

std::vector<Unit> units_of(std::string_view text) {
  std::vector<Unit> u;
  u.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    int32_t cp = -1;
    std::size_t len = utf8_decode(text, i, cp);
    if (len == 0) { len = 1; cp = -1; }
    u.push_back({i, i + len, cp, classify(cp)});
    i += len;
  }
  return u;
}

/// Length (in units) of the gpt2 regex match at u[i] within [i, end); always >= 1.
std::size_t gpt2_match(const std::vector<Unit>& u, std::size_t i, std::size_t end) {
  auto cp = [&](std::size_t k) { return k < end ? u[k].cp : -2; };
  auto cls_run = [&](std::size_t k, CharClass c) {
    std::size_t j = k;
    while (j < end && u[j].cls == c) ++j;
    return j - k;
  };
  // 's|'t|'re|'ve|'m|'ll|'d
  if (cp(i) == '\'') {
    const int32_t a = cp(i + 1), b = cp(i + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  // ' ?X+' for X = \p{L}, \p{N}, [^\s\p{L}\p{N}]
  const std::size_t lead = cp(i) == ' ' ? 1 : 0;
  for (CharClass c : {kLetter, kNumber, kOther}) {
    if (lead && i + 1 < end && u[i + 1].cls == c) return 1 + cls_run(i + 1, c);
    if (u[i].cls == c) return cls_run(i, c);
  }
  // \s+(?!\S) | \s+   (u[i] is whitespace here: every other class returned above)
  const std::size_t run = cls_run(i, kSpace);
  if (i + run == end || run == 1) return run;  // end of text, or the single space the lookahead would leave behind
  return run - 1;                              // leave the last space for the following piece
}

void split_gpt2(const std::vector<Unit>& u, std::size_t begin, std::size_t end,
                std::vector<std::pair<std::size_t, std::size_t>>& out) {
  for (std::size_t i = begin; i < end;) {
    const std::size_t n = gpt2_match(u, i, end);
    out.emplace_back(u[i].begin, u[i + n - 1].end);
    i += n;
  }
}

}  // namespace

bool parse_pre_tokenizer(std::string_view name, PreTokenizerKind& out) {
  if (name == "gpt2" || name == "default") { out = PreTokenizerKind::gpt2; return true; }
  if (name == "smollm") { out = PreTokenizerKind::smollm; return true; }
  return false;
}

std::vector<std::pair<std::size_t, std::size_t>> pre_tokenize(PreTokenizerKind kind, std::string_view text) {
  const std::vector<Unit> u = units_of(text);
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if (kind == PreTokenizerKind::gpt2) {
    split_gpt2(u, 0, u.size(), out);
    return out;
  }
  // smollm: every \p{N} unit alone, gpt2 on the runs in between.
  std::size_t run = 0;
  for (std::size_t i = 0; i <= u.size(); ++i) {
    if (i == u.size() || u[i].cls == kNumber) {
      split_gpt2(u, run, i, out);
      if (i < u.size()) out.emplace_back(u[i].begin, u[i].end);
      run = i + 1;
    }
  }
  return out;
}

}  // namespace flashkv::engine_detail
