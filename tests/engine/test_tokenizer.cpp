// Tokenizer: encode/decode round trips on the shipped vocabulary (ASCII, punctuation, multi-byte UTF-8 via byte
// fallback, control bytes), llama2.c conventions (BOS, dummy prefix, BOS leading-space rule), and unknown characters
// on a vocabulary without byte pieces.
#include <gtest/gtest.h>

#include <random>

#include "flashkv/error.hpp"
#include "test_util.hpp"

using namespace flashkv;
using namespace flashkv::test;

namespace {
const Tokenizer& shipped() {
  static const Tokenizer t = Tokenizer::load_llama2c(tokenizer_path(), 512);
  return t;
}
}  // namespace

TEST(Tokenizer, ShippedVocabularyBasics) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Tokenizer& t = shipped();
  EXPECT_EQ(t.vocab_size(), 512);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.piece(3), "<0x00>");
  EXPECT_EQ(t.lookup("in"), 259);
  EXPECT_EQ(t.lookup("no-such-piece"), -1);
}

TEST(Tokenizer, EncodeConventions) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Tokenizer& t = shipped();
  EXPECT_EQ(t.encode("", true, false), std::vector<int32_t>{1});
  EXPECT_EQ(t.encode("", true, true), (std::vector<int32_t>{1, 2}));
  auto ids = t.encode("in", false, false);
  // Dummy prefix: " in" — merged into pieces whose concatenation is " in".
  std::string joined;
  for (int32_t id : ids) joined += t.piece(id);
  EXPECT_EQ(joined, " in");
  // Merges pick the highest score: "in" (score 0) beats any other pair; the result is never longer than chars.
  auto many = t.encode("The dreams of the machine are bright.", true, false);
  EXPECT_EQ(many[0], 1);
  EXPECT_LT(many.size(), std::string("The dreams of the machine are bright.").size());
}

TEST(Tokenizer, RoundTripsAsciiUnicodeAndBytes) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Tokenizer& t = shipped();
  const std::vector<std::string> texts = {
      "Echoes of vectors unfold in the quiet of silicon dreams.",
      "  leading spaces, trailing spaces  ",
      "tabs\tand\nnewlines\r\n",
      "digits 0123456789 and symbols !@#$%^&*()_+-=[]{};':\",./<>?",
      "caf\xC3\xA9 \xC2\xB0 \xCE\xBB\xCE\xBC",           // é ° λ μ (é via bytes, ° λ μ are pieces)
      "emoji \xF0\x9F\x98\x80 and CJK \xE6\xBC\xA2\xE5\xAD\x97",  // 😀 漢字 → byte fallback
      std::string("nul\0byte", 8),
      "\x01\x02\x7f control",
  };
  for (const auto& s : texts) {
    auto ids = t.encode(s, true, false);
    ASSERT_GE(ids.size(), 2u);
    std::vector<int32_t> body(ids.begin() + 1, ids.end());
    EXPECT_EQ(t.decode(body), s) << "text: " << s;
  }
}

TEST(Tokenizer, ByteFallbackUsesByteTokens) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Tokenizer& t = shipped();
  auto ids = t.encode("\xF0\x9F\x98\x80", false, false);  // 😀 is not a piece: 4 byte tokens after the prefix
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids[1], 0xF0 + 3);
  EXPECT_EQ(ids[2], 0x9F + 3);
  EXPECT_EQ(ids[3], 0x98 + 3);
  EXPECT_EQ(ids[4], 0x80 + 3);
  EXPECT_EQ(t.decode_piece(5, 0xF0 + 3), "\xF0");
}

TEST(Tokenizer, RandomUtf8RoundTrips) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Tokenizer& t = shipped();
  std::mt19937_64 rng(test_seed());
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(rng() % 256));  // arbitrary bytes, invalid UTF-8 too
    std::vector<int32_t> ids = t.encode(s, false, false);
    EXPECT_EQ(t.decode(ids), s);
  }
}

TEST(Tokenizer, UnknownCharactersWithoutBytePieces) {
  Tokenizer t({"<unk>", "<s>", "</s>", " ", "a", "b", "ab", " ab"}, {0, 0, 0, -1, -2, -3, 5, 10});
  auto ids = t.encode("ab\xC3\xA9", true, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 7, 0, 0}));  // " ab" merged (score 10); é (2 bytes) → one <unk> per byte
  EXPECT_EQ(t.decode_piece(1, 7), "ab");  // BOS strips the leading space
  EXPECT_EQ(t.decode_piece(4, 7), " ab");
  EXPECT_THROW(t.decode_piece(1, 8), Error);
  EXPECT_THROW(t.decode_piece(1, -1), Error);
}

TEST(Tokenizer, WriteReadRoundTrip) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  const Tokenizer& t = shipped();
  const std::string p = temp_path("tok.bin");
  t.write_llama2c(p);
  EXPECT_EQ(read_bytes(p), read_bytes(tokenizer_path()));
}

TEST(Tokenizer, InvalidConstruction) {
  EXPECT_THROW(Tokenizer({}, {}), Error);
  EXPECT_THROW(Tokenizer({"a"}, {0.0f, 1.0f}), Error);
  EXPECT_THROW(Tokenizer({"a", "b"}, {0.0f, 1.0f}, 5, 1, 0), Error);
}
