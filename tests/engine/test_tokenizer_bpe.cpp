// Byte-level BPE: the pre-tokenizer regexes (gpt2, smollm) on hand-derived cases, merge order, special tokens,
// byte round trips (invalid UTF-8 included), bytes a vocabulary cannot represent, malformed vocabularies, the GGUF
// round trip of a BPE vocabulary, ChatML rendering, and SmolLM2's real vocabulary when it is installed.
// (Agreement with Hugging Face `tokenizers` on real text is tests/engine/test_smollm2.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "flashkv/error.hpp"
#include "test_util.hpp"

using namespace flashkv;
using namespace flashkv::test;

namespace {

/// GPT-2's byte alphabet, written independently of the library: printable Latin-1 bytes stand for themselves, the
/// others map to U+0100 + k in byte order.
std::string byte_symbol(int b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    auto utf8 = [](int cp) {
      std::string s;
      if (cp < 0x80) s += static_cast<char>(cp);
      else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return s;
    };
    for (int c = 0; c < 256; ++c) {
      const bool keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      t[static_cast<std::size_t>(c)] = utf8(keep ? c : next++);
    }
    return t;
  }();
  return table[static_cast<std::size_t>(b)];
}

std::string sym(const std::string& bytes) {
  std::string s;
  for (unsigned char c : bytes) s += byte_symbol(c);
  return s;
}

/// 256 byte symbols, then merged tokens, then three specials. merges are given in raw bytes ("h e").
BpeVocab toy_vocab(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& pre = "smollm",
                   std::vector<int> drop_bytes = {}) {
  BpeVocab v;
  for (int b = 0; b < 256; ++b) {
    if (std::find(drop_bytes.begin(), drop_bytes.end(), b) != drop_bytes.end()) v.tokens.push_back("<unused" + std::to_string(b) + ">");
    else v.tokens.push_back(byte_symbol(b));
  }
  for (const auto& [l, r] : merges) {
    v.merges.push_back(sym(l) + " " + sym(r));
    const std::string joined = sym(l + r);
    if (std::find(v.tokens.begin(), v.tokens.end(), joined) == v.tokens.end()) v.tokens.push_back(joined);
  }
  v.token_types.assign(v.tokens.size(), static_cast<int32_t>(TokenType::normal));
  for (const char* s : {"<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(s);
    v.token_types.push_back(static_cast<int32_t>(TokenType::control));
  }
  v.tokens.push_back("<tool>");
  v.token_types.push_back(static_cast<int32_t>(TokenType::user_defined));
  v.bos_id = static_cast<int32_t>(v.tokens.size()) - 3;
  v.eos_id = static_cast<int32_t>(v.tokens.size()) - 2;
  v.pre = pre;
  return v;
}

std::vector<std::string> pieces(const std::string& pre, const std::string& text) {
  return Tokenizer::byte_level_bpe(toy_vocab({}, pre)).pre_tokenize(text);
}

using Pieces = std::vector<std::string>;

}  // namespace

TEST(PreTokenizer, Gpt2RegexCases) {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ — derived by hand.
  EXPECT_EQ(pieces("gpt2", "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("gpt2", "it's 2024!"), (Pieces{"it", "'s", " 2024", "!"}));
  EXPECT_EQ(pieces("gpt2", "we'll've'd"), (Pieces{"we", "'ll", "'ve", "'d"}));
  EXPECT_EQ(pieces("gpt2", "I'LL"), (Pieces{"I", "'", "LL"}));  // contractions are case-sensitive
  EXPECT_EQ(pieces("gpt2", "a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces("gpt2", "a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("gpt2", "x   "), (Pieces{"x", "   "}));
  EXPECT_EQ(pieces("gpt2", "hi!! ok ..."), (Pieces{"hi", "!!", " ok", " ..."}));
  EXPECT_EQ(pieces("gpt2", "héllo wörld"), (Pieces{"héllo", " wörld"}));
  EXPECT_EQ(pieces("gpt2", "e\xCC\x81t"), (Pieces{"e", "\xCC\x81", "t"}));  // U+0301 is a mark (Mn): "other"
  EXPECT_EQ(pieces("gpt2", "日本語です。"), (Pieces{"日本語です", "。"}));
  EXPECT_EQ(pieces("gpt2", "a\xC2\xA0" "b"), (Pieces{"a", "\xC2\xA0", "b"}));  // U+00A0 is White_Space
  EXPECT_EQ(pieces("gpt2", "ab\xFF\xFE" "cd"), (Pieces{"ab", "\xFF\xFE", "cd"}));  // invalid bytes: "other"
  EXPECT_EQ(pieces("gpt2", " \xF0\x9F\x98\x80!"), (Pieces{" \xF0\x9F\x98\x80!"}));  // emoji (So) + '!' others
  EXPECT_EQ(pieces("gpt2", ""), (Pieces{}));
}

TEST(PreTokenizer, SmollmIsolatesEveryDigitFirst) {
  EXPECT_EQ(pieces("smollm", "it's 2024!"), (Pieces{"it", "'s", " ", "2", "0", "2", "4", "!"}));
  EXPECT_EQ(pieces("smollm", "abc123def"), (Pieces{"abc", "1", "2", "3", "def"}));
  // the lookahead sees each digit-free run alone: "a  " before a digit ends its run
  EXPECT_EQ(pieces("smollm", "a  1"), (Pieces{"a", "  ", "1"}));
  EXPECT_EQ(pieces("smollm", "x\xD9\xA3y"), (Pieces{"x", "\xD9\xA3", "y"}));  // U+0663 ARABIC-INDIC DIGIT THREE (Nd)
  EXPECT_EQ(pieces("smollm", "\xE2\x85\xA2 V"), (Pieces{"\xE2\x85\xA2", " V"}));  // U+2162 ROMAN NUMERAL THREE (Nl)
  // every piece boundary covers the text exactly
  const std::string text = "Mixed 12 text\t\twith 'quotes' and 3.14159...\n";
  std::string joined;
  for (const auto& p : pieces("smollm", text)) joined += p;
  EXPECT_EQ(joined, text);
}

TEST(ByteLevelBpe, MergesLowestRankFirstLeftmostOnTies) {
  // "abc": rank 0 "b c" beats rank 1 "a b" → a | bc
  Tokenizer t1 = Tokenizer::byte_level_bpe(toy_vocab({{"b", "c"}, {"a", "b"}}));
  const auto r1 = t1.encode("abc", false);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(t1.piece(r1[0]), "a");
  EXPECT_EQ(t1.piece(r1[1]), "bc");
  Tokenizer t2 = Tokenizer::byte_level_bpe(toy_vocab({{"a", "b"}, {"b", "c"}}));
  const auto r2 = t2.encode("abc", false);
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_EQ(t2.piece(r2[0]), "ab");
  // "aaa" with "a a": the leftmost pair merges first → aa | a
  Tokenizer t3 = Tokenizer::byte_level_bpe(toy_vocab({{"a", "a"}}));
  const auto r3 = t3.encode("aaa", false);
  ASSERT_EQ(r3.size(), 2u);
  EXPECT_EQ(t3.piece(r3[0]), "aa");
  // chains build longer tokens; the space is part of the piece (Ġ in the alphabet)
  Tokenizer t4 = Tokenizer::byte_level_bpe(
      toy_vocab({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {"o", "r"}, {" w", "or"}}));
  const auto r4 = t4.encode("hello world", false);
  ASSERT_EQ(r4.size(), 4u);
  EXPECT_EQ(t4.piece(r4[0]), "hello");
  EXPECT_EQ(t4.piece(r4[1]), sym(" wor"));
  EXPECT_EQ(t4.decode(r4), "hello world");
}

TEST(ByteLevelBpe, SpecialTokensWholeWhenParsed) {
  Tokenizer t = Tokenizer::byte_level_bpe(toy_vocab({{"h", "i"}}));
  const int32_t start = t.lookup("<|im_start|>"), end = t.lookup("<|im_end|>"), tool = t.lookup("<tool>");
  const auto on = t.encode("<|im_start|>hi<tool><|im_end|>", false, false, true);
  EXPECT_EQ(on, (std::vector<int32_t>{start, t.lookup("hi"), tool, end}));
  const auto off = t.encode("<|im_start|>hi", false, false, false);
  EXPECT_EQ(off.size(), 13u);  // bytes of "<|im_start|>" + "hi"
  EXPECT_EQ(t.decode(off), "<|im_start|>hi");
  EXPECT_EQ(t.decode(on), "<|im_start|>hi<tool><|im_end|>");
  // BOS / EOS on request; add_bos() from the vocabulary (false here)
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.encode("hi", true, true).front(), t.bos_id());
  EXPECT_EQ(t.encode("hi", true, true).back(), t.eos_id());
  EXPECT_EQ(t.encode_prompt("hi"), (std::vector<int32_t>{t.lookup("hi")}));
  EXPECT_EQ(t.token_type(start), TokenType::control);
  EXPECT_EQ(t.end_of_generation(), (std::vector<int32_t>{end}));  // eos = <|im_end|>
}

TEST(ByteLevelBpe, EveryByteStringRoundTrips) {
  Tokenizer t = Tokenizer::byte_level_bpe(toy_vocab({{"a", "b"}, {" ", "a"}, {"\xC3", "\xA9"}}));
  EXPECT_TRUE(t.unrepresentable_bytes().empty());
  std::mt19937_64 rng(test_seed());
  for (int i = 0; i < 2000; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) {
      const int k = static_cast<int>(rng() % 8);
      c = k < 3 ? "ab "[k] : k == 3 ? '\n' : k == 4 ? '1' : static_cast<char>(rng() % 256);
    }
    if (i % 7 == 0) s += "<|im_end|>";
    for (bool special : {false, true}) ASSERT_EQ(t.decode(t.encode(s, false, false, special)), s) << i;
  }
}

TEST(ByteLevelBpe, BytesWithoutASymbolAreDropped) {
  Tokenizer t = Tokenizer::byte_level_bpe(toy_vocab({{"a", "b"}}, "smollm", {0x04, 0xFF}));
  EXPECT_EQ(t.unrepresentable_bytes(), (std::vector<uint8_t>{0x04, 0xFF}));
  EXPECT_EQ(t.decode(t.encode("a\x04" "b\xFF", false)), "ab");
  // the dropped byte still separates its neighbours (llama.cpp's behaviour; Hugging Face would merge "ab")
  EXPECT_EQ(t.encode("a\x04" "b", false).size(), 2u);
}

TEST(ByteLevelBpe, MalformedVocabulariesAreIoErrors) {
  auto expect_io = [](BpeVocab v, const std::string& needle) {
    try {
      Tokenizer::byte_level_bpe(std::move(v), "vocab.gguf");
      FAIL() << "expected IoError with " << needle;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("vocab.gguf"), std::string::npos) << e.what();
    }
  };
  BpeVocab v = toy_vocab({{"a", "b"}});
  v.merges.push_back("ab");
  expect_io(v, "merge 1 'ab'");
  v = toy_vocab({{"a", "b"}});
  v.merges.push_back(sym("x") + " " + sym("y"));  // "xy" is not a token
  expect_io(v, "not in the vocabulary");
  v = toy_vocab({});
  v.pre = "llama-bpe";
  expect_io(v, "unsupported pre-tokenizer");
  v = toy_vocab({});
  v.eos_id = 100000;
  expect_io(v, "eos_token_id 100000 out of range");
  v = toy_vocab({});
  v.token_types[3] = 9;
  expect_io(v, "token_type 9");
  v = toy_vocab({});
  v.token_types.pop_back();
  expect_io(v, "token_type has");
}

TEST(ByteLevelBpe, GgufRoundTripKeepsTheVocabulary) {
  FLASHKV_SKIP_WITHOUT_MODELS();
  Model m = load_model(model_path());  // 512-token llama2.c model: give it a 512-token BPE vocabulary
  BpeVocab v = toy_vocab({{"h", "e"}, {"l", "l"}, {"he", "ll"}});
  v.tokens.resize(static_cast<std::size_t>(m.config.vocab_size) - 3, "");
  for (std::size_t i = 259; i < v.tokens.size(); ++i) v.tokens[i] = "<pad" + std::to_string(i) + ">";
  v.tokens.push_back("<|im_start|>");
  v.tokens.push_back("<|im_end|>");
  v.tokens.push_back("<tool>");
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[v.tokens.size() - 3] = v.token_types[v.tokens.size() - 2] = 3;
  v.token_types.back() = 4;
  v.bos_id = m.config.vocab_size - 3;
  v.eos_id = m.config.vocab_size - 2;
  v.chat_template = "{{ '<|im_start|>' }}{{ '<|im_end|>' }}";
  Tokenizer t = Tokenizer::byte_level_bpe(v);
  const std::string path = temp_path("bpe.gguf");
  write_gguf(m, t, path, GgufType::f32);
  Model back = load_gguf(path);
  ASSERT_TRUE(back.embedded_tokenizer);
  const Tokenizer& u = *back.embedded_tokenizer;
  EXPECT_EQ(u.kind(), TokenizerKind::gpt2_bpe);
  EXPECT_EQ(u.pre_tokenizer(), "smollm");
  EXPECT_EQ(u.merges(), t.merges());
  EXPECT_EQ(u.chat_template(), v.chat_template);
  EXPECT_EQ(u.add_bos(), false);
  EXPECT_EQ(back.stop_tokens, (std::vector<int32_t>{v.eos_id}));
  for (const char* s : {"hello <|im_start|>x", "12 hell\xFF"}) EXPECT_EQ(u.encode(s, false, false, true), t.encode(s, false, false, true));
}

TEST(ChatTemplate, RendersChatMLWithTheTemplatesDefaultSystemPrompt) {
  const std::string tpl =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "You are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
      "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  EXPECT_EQ(chat_default_system_prompt(tpl), "You are helpful.");
  const std::vector<ChatMessage> user{{"user", "Hi"}};
  EXPECT_EQ(render_chat(tpl, user, true),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<ChatMessage> sys{{"system", "Be terse."}, {"user", "Hi"}, {"assistant", "Hello."}};
  EXPECT_EQ(render_chat(tpl, sys, false),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n");
  EXPECT_EQ(render_chat(tpl, {}, true), "<|im_start|>assistant\n");
  EXPECT_THROW(render_chat("", user), Error);
  EXPECT_THROW(render_chat("{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}", user), Error);
  EXPECT_THROW(render_chat(tpl, std::vector<ChatMessage>{{"", "x"}}), Error);
}

TEST(SmolLM2Vocabulary, RoundTripsAndConventions) {
  FLASHKV_REQUIRE_SMOLLM2();
  auto tok = load_gguf_vocabulary(smollm2_path());
  const Tokenizer& t = *tok;
  EXPECT_EQ(t.kind(), TokenizerKind::gpt2_bpe);
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.pre_tokenizer(), "smollm");
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.piece(t.bos_id()), "<|im_start|>");
  EXPECT_EQ(t.piece(t.eos_id()), "<|im_end|>");
  EXPECT_EQ(t.end_of_generation(), (std::vector<int32_t>{0, 2}));  // <|endoftext|>, <|im_end|>
  EXPECT_EQ(t.unrepresentable_bytes().size(), 21u);
  EXPECT_EQ(chat_default_system_prompt(t.chat_template()),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  EXPECT_EQ(t.encode("Hello world", false), (std::vector<int32_t>{19556, 905}));
  // random byte strings (invalid UTF-8 included) without the 21 unrepresentable bytes round-trip exactly
  const auto bad = t.unrepresentable_bytes();
  std::mt19937_64 rng(test_seed());
  const char* words[] = {" the", "ing", "\n", "  ", "123", "<|im_start|>", "é", "日本", "\xF0\x9F\x98\x80", "'s"};
  for (int i = 0; i < 3000; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) {
      if (rng() % 3 == 0) {
        s += words[rng() % 10];
      } else {
        unsigned char c;
        do c = static_cast<unsigned char>(rng() % 256);
        while (std::find(bad.begin(), bad.end(), c) != bad.end());
        s += static_cast<char>(c);
      }
    }
    ASSERT_EQ(t.decode(t.encode(s, false, false, i % 2 == 0)), s) << i;
  }
}
