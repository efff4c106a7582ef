// Tokenizer conformance and behaviour: the llama.cpp / Hugging Face vectors
// must match exactly, special tokens, round trips, streaming detokenization.
#include <QtTest/QtTest>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "phaselab/gguf.h"
#include "phaselab/log.h"
#include "phaselab/tokenizer.h"
#include "runtime/answer_builder.h"

using namespace phaselab;

namespace {

std::string vocab_path(const std::string& name) {
  return std::string(PHASELAB_TEST_DATA) + "/tokenizer-vectors/ggml-vocab-" + name + ".gguf";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string ids_to_string(const std::vector<TokenId>& ids) {
  std::string s;
  for (TokenId id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// Shows control characters so a failing string can be read in the log.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}

bool valid_utf8(const std::string& s) { return utf8_complete_prefix(s) == s.size(); }

struct Loaded {
  std::shared_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tok;
};

Loaded load(const std::string& path) {
  Loaded l;
  auto f = GgufFile::open(path);
  if (!f) {
    qWarning("open %s: %s", path.c_str(), f.status().message().c_str());
    return l;
  }
  l.file = f.value();
  auto t = Tokenizer::from_gguf(*l.file);
  if (!t) {
    qWarning("from_gguf %s: %s", path.c_str(), t.status().message().c_str());
    return l;
  }
  l.tok = std::move(t.value());
  return l;
}

// The default model (Gemma 3 270M), looked for where the engine and
// scripts/test.sh put it: PHASELAB_DEFAULT_MODEL first (then it must exist:
// a path that was set but is missing is an error, not a reason to skip),
// else the engine's model folder (user_model_dir(): PHASELAB_MODEL_DIR, else
// $XDG_DATA_HOME/PhaseLab/models, else ~/.local/share/PhaseLab/models), else
// /tmp/models.
struct GemmaPath {
  std::string path;   // empty: not found
  std::string error;  // set when PHASELAB_DEFAULT_MODEL names a missing file
};

GemmaPath find_gemma() {
  if (const char* p = std::getenv("PHASELAB_DEFAULT_MODEL"); p && *p) {
    if (std::filesystem::is_regular_file(p)) return {p, {}};
    return {{}, std::string("PHASELAB_DEFAULT_MODEL is set to '") + p + "', which is not a file"};
  }
  const std::string name = "gemma-3-270m-q4_k_m.gguf";
  for (const std::string& dir : {user_model_dir(), std::string("/tmp/models")}) {
    const std::string c = dir + "/" + name;
    if (std::filesystem::is_regular_file(c)) return {c, {}};
  }
  return {};
}

// A minimal gpt2 vocabulary; callers change keys to make it bad.
GgufWriter tiny_bpe_writer() {
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufWriteValue::string("gpt2"));
  w.set("tokenizer.ggml.pre", GgufWriteValue::string("gpt-2"));
  w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array({"a", "b", "ab"}));
  w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array({1, 1, 1}));
  w.set("tokenizer.ggml.merges", GgufWriteValue::string_array({"a b"}));
  return w;
}

Result<std::unique_ptr<Tokenizer>> from_writer(const GgufWriter& w) {
  auto f = GgufFile::from_bytes(w.serialize());
  if (!f) return f.status();
  return Tokenizer::from_gguf(*f.value());
}

}  // namespace

class TestTokenizer : public QObject {
  Q_OBJECT

 private:
  // Every line of NAME.gguf.inp must encode (no BOS, no special parsing) to
  // the ids on the same line of NAME.gguf.out.
  void check_vectors(const std::string& name) {
    const std::string path = vocab_path(name);
    Loaded l = load(path);
    QVERIFY2(l.tok, path.c_str());

    const std::string raw = read_file(path + ".inp");
    const std::string sep = "\n__ggml_vocab_test__\n";
    // Split as llama.cpp's test-tokenizer-0 does: a trailing separator does
    // not start another (empty) string.
    std::vector<std::string> inputs;
    for (size_t pos = 0; pos < raw.size();) {
      const size_t next = raw.find(sep, pos);
      if (next == std::string::npos) {
        inputs.push_back(raw.substr(pos));
        break;
      }
      inputs.push_back(raw.substr(pos, next - pos));
      pos = next + sep.size();
    }

    std::vector<std::vector<TokenId>> expected;
    std::istringstream out(read_file(path + ".out"));
    for (std::string line; std::getline(out, line);) {
      std::vector<TokenId> ids;
      std::istringstream ls(line);
      for (long v; ls >> v;) ids.push_back(static_cast<TokenId>(v));
      expected.push_back(std::move(ids));
    }
    QCOMPARE(inputs.size(), expected.size());
    QVERIFY(!inputs.empty());

    int failures = 0;
    for (size_t i = 0; i < inputs.size(); i++) {
      const std::vector<TokenId> got = l.tok->encode(inputs[i], /*add_special=*/false, /*parse_special=*/false);
      if (got != expected[i]) {
        failures++;
        qWarning("%s vector %zu mismatch for '%s'\n  expected: %s\n  got:      %s", name.c_str(), i,
                 printable(inputs[i]).c_str(), ids_to_string(expected[i]).c_str(), ids_to_string(got).c_str());
      }
    }
    QVERIFY2(failures == 0, (std::to_string(failures) + " of " + std::to_string(inputs.size()) +
                             " vectors differ for " + name).c_str());
  }

 private slots:
  void vectors_llama_spm() { check_vectors("llama-spm"); }
  void vectors_gpt2() { check_vectors("gpt-2"); }
  void vectors_deepseek_coder() { check_vectors("deepseek-coder"); }

  void vocab_metadata() {
    Loaded spm = load(vocab_path("llama-spm"));
    QVERIFY(spm.tok);
    QCOMPARE(spm.tok->kind(), Tokenizer::Kind::spm);
    QCOMPARE(spm.tok->bos(), 1);
    QCOMPARE(spm.tok->eos(), 2);
    QVERIFY(spm.tok->add_bos());
    QVERIFY(!spm.tok->add_eos());
    QVERIFY(spm.tok->add_space_prefix());
    QVERIFY(spm.tok->is_eog(2));
    QVERIFY(!spm.tok->is_eog(1));
    QCOMPARE(spm.tok->find_token("<0x0A>").value_or(-1), 13);
    QCOMPARE(spm.tok->token_attr(1), TokenAttr::control);

    Loaded bpe = load(vocab_path("gpt-2"));
    QVERIFY(bpe.tok);
    QCOMPARE(bpe.tok->kind(), Tokenizer::Kind::bpe);
    QCOMPARE(bpe.tok->pre(), std::string("gpt-2"));
    QVERIFY(!bpe.tok->add_bos());
    const auto eot = bpe.tok->find_token("<|endoftext|>");
    QVERIFY(eot.has_value());
    QVERIFY(bpe.tok->is_eog(*eot));
  }

  void add_special_adds_bos() {
    Loaded l = load(vocab_path("llama-spm"));
    QVERIFY(l.tok);
    const auto with = l.tok->encode("Hello", true, false);
    const auto without = l.tok->encode("Hello", false, false);
    QVERIFY(!with.empty());
    QCOMPARE(with.front(), l.tok->bos());
    QCOMPARE(std::vector<TokenId>(with.begin() + 1, with.end()), without);
    QCOMPARE(l.tok->encode("", true, false), std::vector<TokenId>{l.tok->bos()});
    QVERIFY(l.tok->encode("", false, false).empty());
  }

  void special_tokens_parsed() {
    Loaded l = load(vocab_path("llama-spm"));
    QVERIFY(l.tok);
    const TokenId bos = l.tok->bos(), eos = l.tok->eos();
    const auto parsed = l.tok->encode("Hello</s><s>world", false, true);
    QVERIFY2(std::find(parsed.begin(), parsed.end(), eos) != parsed.end(), ids_to_string(parsed).c_str());
    QVERIFY2(std::find(parsed.begin(), parsed.end(), bos) != parsed.end(), ids_to_string(parsed).c_str());
    // Text around the special tokens is encoded as on its own (a fragment
    // right after a special token gets the space prefix, as in llama.cpp).
    std::vector<TokenId> expect = l.tok->encode("Hello", false, false);
    expect.push_back(eos);
    expect.push_back(bos);
    const auto world = l.tok->encode("world", false, false);
    expect.insert(expect.end(), world.begin(), world.end());
    QCOMPARE(parsed, expect);

    // Without parse_special the same text is plain text.
    const auto plain = l.tok->encode("Hello</s><s>world", false, false);
    QVERIFY(std::find(plain.begin(), plain.end(), eos) == plain.end());
    QVERIFY(std::find(plain.begin(), plain.end(), bos) == plain.end());
    QCOMPARE(l.tok->decode(plain), std::string("Hello</s><s>world"));

    // Control tokens render only on request.
    QCOMPARE(l.tok->token_to_piece(eos), std::string());
    QCOMPARE(l.tok->token_to_piece(eos, true), std::string("</s>"));

    Loaded g = load(vocab_path("gpt-2"));
    QVERIFY(g.tok);
    const TokenId eot = g.tok->find_token("<|endoftext|>").value();
    const auto bpe = g.tok->encode("Hi<|endoftext|>there", false, true);
    std::vector<TokenId> bpe_expect = g.tok->encode("Hi", false, false);
    bpe_expect.push_back(eot);
    const auto there = g.tok->encode("there", false, false);
    bpe_expect.insert(bpe_expect.end(), there.begin(), there.end());
    QCOMPARE(bpe, bpe_expect);
    const auto bpe_plain = g.tok->encode("Hi<|endoftext|>there", false, false);
    QVERIFY(std::find(bpe_plain.begin(), bpe_plain.end(), eot) == bpe_plain.end());
  }

  void round_trip_spm() {
    // SPM adds a space prefix on encode; decode drops it again for the first
    // token (after any BOS), so the round trip is exact.
    Loaded l = load(vocab_path("llama-spm"));
    QVERIFY(l.tok);
    const std::vector<std::string> texts = {
        "Hello world",
        " leading space",
        "   three leading spaces and trailing  ",
        "emoji 🙂🚀 and 😶‍🌫️",
        "中文 你好，世界 日本語 한국어",
        "tabs\tand\nnewlines\n\n",
        "Ünïcödé ½ ∑ x²",
        "",
    };
    for (const auto& t : texts) {
      for (bool add_special : {false, true}) {
        const auto ids = l.tok->encode(t, add_special, false);
        const std::string back = l.tok->decode(ids);
        QVERIFY2(back == t, ("'" + t + "' decoded as '" + back + "' from " + ids_to_string(ids)).c_str());
      }
    }
  }

  void round_trip_bpe() {
    for (const char* name : {"gpt-2", "deepseek-coder"}) {
      Loaded l = load(vocab_path(name));
      QVERIFY(l.tok);
      std::vector<std::string> texts = {"Hello world", "  two spaces", "emoji 🙂 CJK 你好 ñ", "a\r\n\tb   \n"};
      // Byte-level BPE represents any byte, so even invalid UTF-8 survives;
      // not with deepseek-coder, whose vocabulary redefines some byte
      // characters (e.g. the one for 0xFF) as user-defined tokens.
      if (std::string(name) == "gpt-2") texts.push_back("bad \xFF\xC3 utf8 \xE4\xBD");
      for (const auto& t : texts) {
        const auto ids = l.tok->encode(t, false, false);
        QVERIFY2(l.tok->decode(ids) == t, (std::string(name) + ": '" + printable(t) + "'").c_str());
      }
    }
  }

  void detokenizer_never_splits_utf8() {
    Loaded l = load(vocab_path("llama-spm"));
    QVERIFY(l.tok);
    // Emoji are not in the Llama 2 vocabulary: they come out as byte tokens,
    // one byte per token.
    const std::string text = "a🙂b 你好 🚀🦙 end";
    const auto ids = l.tok->encode(text, false, false);
    IncrementalDetokenizer det(*l.tok);
    std::string streamed;
    int held = 0;
    for (TokenId id : ids) {
      const std::string part = det.push(id);
      QVERIFY2(valid_utf8(part), ("partial output is not valid UTF-8 after token " + std::to_string(id)).c_str());
      if (part.empty()) held++;
      streamed += part;
    }
    streamed += det.flush();
    QVERIFY(held > 0);  // some byte tokens really were held back
    QCOMPARE(streamed, l.tok->token_to_piece(ids[0]) + l.tok->decode(std::vector<TokenId>(ids.begin() + 1, ids.end())));

    // A truncated sequence is held, then becomes U+FFFD on flush.
    const TokenId f0 = l.tok->find_token("<0xF0>").value();
    const TokenId f9f = l.tok->find_token("<0x9F>").value();
    det.reset();
    QCOMPARE(det.push(f0), std::string());
    QCOMPARE(det.push(f9f), std::string());
    QCOMPARE(det.flush(), std::string("\xEF\xBF\xBD"));
    // A byte that can never start a sequence is replaced at once.
    const TokenId ff = l.tok->find_token("<0xFF>").value();
    QCOMPARE(det.push(ff), std::string("\xEF\xBF\xBD"));
    QCOMPARE(det.flush(), std::string());
  }

  void utf8_prefix() {
    QCOMPARE(utf8_complete_prefix(""), size_t(0));
    QCOMPARE(utf8_complete_prefix("abc"), size_t(3));
    QCOMPARE(utf8_complete_prefix("a\xF0\x9F\x99"), size_t(1));      // truncated emoji
    QCOMPARE(utf8_complete_prefix("a\xF0\x9F\x99\x82"), size_t(5));  // complete emoji
    QCOMPARE(utf8_complete_prefix("ab\xFF" "c"), size_t(2));         // invalid byte
    QCOMPARE(utf8_complete_prefix("\xC0\x80"), size_t(0));           // overlong
    QCOMPARE(utf8_complete_prefix("\xED\xA0\x80"), size_t(0));       // surrogate
  }

  void unknown_pre_tokenizer_refused() {
    GgufWriter w = tiny_bpe_writer();
    w.set("tokenizer.ggml.pre", GgufWriteValue::string("nonsense"));
    auto t = from_writer(w);
    QVERIFY(!t.is_ok());
    QVERIFY2(t.status().message().find("nonsense") != std::string::npos, t.status().message().c_str());
    QVERIFY2(t.status().message().find("pre-tokenizer") != std::string::npos, t.status().message().c_str());

    // The same file with a known pre-tokenizer loads and merges.
    auto ok = from_writer(tiny_bpe_writer());
    QVERIFY2(ok.is_ok(), ok.status().message().c_str());
    QCOMPARE(ok.value()->encode("ab", false, false), std::vector<TokenId>{2});
  }

  // o200k's pre-tokenizer (gpt-4o, gpt-oss): words split where lower case
  // turns upper, numbers in threes. A merge across such a split must not
  // apply; under gpt-2's pre-tokenizer (letters and digits in runs) it does.
  void gpt_4o_pre_tokenizer_splits_case_changes_and_digit_triples() {
    auto make = [](const char* pre) {
      GgufWriter w;
      w.set("tokenizer.ggml.model", GgufWriteValue::string("gpt2"));
      w.set("tokenizer.ggml.pre", GgufWriteValue::string(pre));
      w.set("tokenizer.ggml.tokens",
            GgufWriteValue::string_array({"h", "e", "l", "o", "W", "r", "d", "1", "2", "3", "4", "5", "oW", "34"}));
      w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(std::vector<int32_t>(14, 1)));
      w.set("tokenizer.ggml.merges", GgufWriteValue::string_array({"o W", "3 4"}));
      return from_writer(w);
    };
    auto o200k = make("gpt-4o"), gpt2 = make("gpt-2");
    QVERIFY2(o200k.is_ok(), o200k.status().message().c_str());
    QVERIFY2(gpt2.is_ok(), gpt2.status().message().c_str());
    const TokenId oW = 12, t34 = 13;
    auto has = [](const std::vector<TokenId>& v, TokenId id) { return std::find(v.begin(), v.end(), id) != v.end(); };
    QVERIFY(!has(o200k.value()->encode("helloWorld", false, false), oW));
    QVERIFY(has(gpt2.value()->encode("helloWorld", false, false), oW));
    QVERIFY(!has(o200k.value()->encode("12345", false, false), t34));  // 123 | 45
    QVERIFY(has(gpt2.value()->encode("12345", false, false), t34));
    QVERIFY(has(o200k.value()->encode("1345", false, false), t34));     // 134 | 5
  }

  // The harmony format (gpt-oss): <|return|> and <|call|> end a reply; its
  // <|end|> closes a channel and does not, while elsewhere <|end|> does.
  void harmony_ends_at_return_and_call_not_at_end() {
    auto make = [](std::vector<std::string> extra) {
      GgufWriter w = tiny_bpe_writer();
      std::vector<std::string> toks = {"a", "b", "ab"};
      toks.insert(toks.end(), extra.begin(), extra.end());
      std::vector<int32_t> types(toks.size(), 1);
      for (size_t i = 3; i < types.size(); i++) types[i] = 3;
      w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
      w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(types));
      return from_writer(w);
    };
    auto harmony = make({"<|end|>", "<|return|>", "<|call|>"});
    QVERIFY2(harmony.is_ok(), harmony.status().message().c_str());
    QVERIFY(!harmony.value()->is_eog(3));
    QVERIFY(harmony.value()->is_eog(4));
    QVERIFY(harmony.value()->is_eog(5));
    auto phi = make({"<|end|>"});
    QVERIFY2(phi.is_ok(), phi.status().message().c_str());
    QVERIFY(phi.value()->is_eog(3));
  }

  // A harmony reply (gpt-oss) through AnswerBuilder: the final channel's
  // text is the answer, the analysis channel's the reasoning, the headers
  // (role, channel names) neither; <|return|> ends it. A vocabulary without
  // the markers leaves every text to the answer.
  void harmony_reply_splits_answer_from_reasoning() {
    GgufWriter w = tiny_bpe_writer();
    const std::vector<std::string> toks = {"a", "b", "ab", "analysis", "final", "assistant", "<|start|>", "<|channel|>",
                                           "<|message|>", "<|end|>", "<|return|>", "<|call|>"};
    std::vector<int32_t> types(toks.size(), 1);
    for (size_t i = 6; i < types.size(); i++) types[i] = 3;
    w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
    w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(types));
    auto tok = from_writer(w);
    QVERIFY2(tok.is_ok(), tok.status().message().c_str());
    enum : int32_t { a, b, ab, analysis, final_, assistant, start, channel, message, end, ret };
    const std::vector<int32_t> reply = {channel, analysis, message, b, ab, end, start, assistant,
                                        channel, final_, message, a, b, ret};
    GenerateOptions opt;
    opt.n_predict = 100;
    GenerateResult res;
    std::vector<int32_t> history;
    std::string streamed, streamed_reasoning;
    AnswerBuilder builder(*tok.value(), opt, res, history, 1000);
    bool done = false;
    for (int32_t id : reply) {
      QVERIFY(!done);
      done = builder.push(id, 1.0, 1, 0, [&](const TokenEvent& e) {
        streamed += e.text;
        streamed_reasoning += e.reasoning;
      });
    }
    QVERIFY(done);
    QCOMPARE(res.metrics.stop_reason, StopReason::eos);
    QCOMPARE(res.text, std::string("ab"));
    QCOMPARE(res.reasoning, std::string("bab"));
    QCOMPARE(streamed, res.text);
    QCOMPARE(streamed_reasoning, res.reasoning);

    // Where the reply starts comes from the prompt: after a raw prompt (no
    // markers) its text is answer; after "<|start|>assistant" the header
    // comes first; after an opened final message, answer again.
    auto run = [&](std::vector<int32_t> prompt, const std::vector<int32_t>& ids) {
      GenerateResult r;
      AnswerBuilder ab(*tok.value(), opt, r, prompt, 1000);
      for (int32_t id : ids) ab.push(id, 1.0, 1, 0, nullptr);
      return r;
    };
    QCOMPARE(run({a, b}, {ab, a}).text, std::string("aba"));
    QCOMPARE(run({a, start, assistant}, {assistant, channel, final_, message, b}).text, std::string("b"));
    QCOMPARE(run({start, assistant, channel, final_, message}, {a, b}).text, std::string("ab"));
    const GenerateResult in_analysis = run({start, assistant, channel, analysis, message}, {a, end});
    QVERIFY(in_analysis.text.empty());
    QCOMPARE(in_analysis.reasoning, std::string("a"));

    // Without the markers (another model), the same texts are all answer.
    auto plain = from_writer(tiny_bpe_writer());
    GenerateResult res2;
    std::vector<int32_t> history2;
    AnswerBuilder builder2(*plain.value(), opt, res2, history2, 1000);
    for (int32_t id : {0, 1, 2}) builder2.push(id, 1.0, 1, 0, nullptr);
    QCOMPARE(res2.text, std::string("abab"));
    QVERIFY(res2.reasoning.empty());
  }

  // A harmony message to a function (gpt-oss's call: the recipient in the
  // header or after the channel's name, ended by <|call|>) becomes the
  // answer's text "<tool_call>{name, arguments}</tool_call>", given out
  // whole as the reply ends (streamed too); arguments that are not JSON go
  // as a string. Its analysis before stays reasoning.
  void harmony_call_becomes_a_tool_call() {
    GgufWriter w = tiny_bpe_writer();
    const std::vector<std::string> toks = {"a", "{\"x\":1}", "not json", "analysis", "commentary", "assistant",
                                           "\xc4\xa0to=functions.get_weather", "\xc4\xa0json", "<|start|>",
                                           "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>",
                                           "<|constrain|>", "{\"x\":\"</tool_call>\"}"};
    std::vector<int32_t> types(toks.size(), 1);
    for (size_t i = 8; i + 1 < types.size(); i++) types[i] = 3;
    w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
    w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(types));
    auto tok = from_writer(w);
    QVERIFY2(tok.is_ok(), tok.status().message().c_str());
    enum : int32_t { a, args, not_json, analysis, commentary, assistant, to_fn, json_, start, channel, message, end, ret,
                     call, constrain, args_lt };
    GenerateOptions opt;
    opt.n_predict = 100;
    auto run = [&](const std::vector<int32_t>& ids, std::string* streamed) {
      GenerateResult r;
      std::vector<int32_t> prompt = {start, assistant};
      AnswerBuilder ab(*tok.value(), opt, r, prompt, 1000);
      for (int32_t id : ids)
        if (ab.push(id, 1.0, 1, 0, [&](const TokenEvent& e) { *streamed += e.text; })) break;
      return r;
    };
    const std::string want = "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"x\":1}}</tool_call>";
    // The recipient after the channel's name, a content type (the model's form).
    std::string streamed;
    GenerateResult r = run({channel, analysis, message, a, end, start, assistant, channel, commentary, to_fn, constrain,
                            json_, message, args, call},
                           &streamed);
    QCOMPARE(r.metrics.stop_reason, StopReason::eos);
    QCOMPARE(QString::fromStdString(r.text), QString::fromStdString(want));
    QCOMPARE(streamed, want);
    QCOMPARE(r.reasoning, std::string("a"));
    // The recipient in the header (the template's form).
    streamed.clear();
    r = run({channel, commentary, message, a, end, start, assistant, to_fn, channel, commentary, json_, message, args, call},
            &streamed);
    QCOMPARE(r.text, want);
    QCOMPARE(r.reasoning, std::string("a"));  // (a commentary without a recipient: a preamble)
    // Arguments that are not JSON: a string.
    streamed.clear();
    r = run({channel, commentary, to_fn, message, not_json, call}, &streamed);
    QCOMPARE(r.text, std::string("<tool_call>{\"name\":\"get_weather\",\"arguments\":\"not json\"}</tool_call>"));
    // "<" in the arguments goes as \u003c: a "</tool_call>" in a string
    // cannot end the block early.
    streamed.clear();
    r = run({channel, commentary, to_fn, message, args_lt, call}, &streamed);
    QCOMPARE(QString::fromStdString(r.text),
             QString("<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"x\":\"\\u003c/tool_call>\"}}</tool_call>"));
    // Cut off in the call (max_tokens): what came of it stays text, its
    // block unclosed (not a call for the server's parser).
    streamed.clear();
    opt.n_predict = 5;
    r = run({channel, commentary, to_fn, message, args, call}, &streamed);
    QCOMPARE(r.metrics.stop_reason, StopReason::length);
    QCOMPARE(QString::fromStdString(r.text), QString("<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"x\":1}"));
    QCOMPARE(streamed, r.text);
    opt.n_predict = 100;
    // A call message closed by <|end|> rather than <|call|>: given out there.
    streamed.clear();
    r = run({channel, commentary, to_fn, message, args, end, start, assistant, channel, commentary, message, a, ret},
            &streamed);
    QCOMPARE(r.text, want);
    QCOMPARE(r.reasoning, std::string("a"));
  }

  // A reply with <think> tags (Qwen3, DeepSeek-R1) through AnswerBuilder:
  // the text between the tags is the reasoning, the rest the answer, the
  // tags and the blank lines after each neither; stop strings see only the
  // answer. A prompt that leaves a block open (DeepSeek-R1's generation
  // prompt ends "<think>\n") starts the reply in it; one that closes it
  // (Qwen3 with thinking off) does not. Without both tags in the
  // vocabulary, the same ids are all answer.
  void think_tags_split_answer_from_reasoning() {
    auto make = [](bool both) {
      GgufWriter w = tiny_bpe_writer();
      std::vector<std::string> toks = {"a", "b", "ab", "\xc4\x8a", "\xc4\xa0", "<think>"};  // Ċ (newline), Ġ (space)
      if (both) toks.push_back("</think>");
      std::vector<int32_t> types(toks.size(), 1);
      for (size_t i = 5; i < types.size(); i++) types[i] = 4;  // user-defined, as Qwen3's GGUFs have them
      w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array(toks));
      w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array(types));
      return from_writer(w);
    };
    auto tok = make(true);
    QVERIFY2(tok.is_ok(), tok.status().message().c_str());
    enum : int32_t { a, b, ab, nl, sp, open, close };
    auto run = [&](std::vector<int32_t> prompt, const std::vector<int32_t>& ids, const Tokenizer& t,
                   std::vector<std::string> stop = {}, bool chat = true) {
      GenerateOptions opt;
      opt.n_predict = 100;
      opt.stop = stop;
      opt.think_is_reasoning = chat;
      GenerateResult r;
      std::string streamed, streamed_reasoning;
      AnswerBuilder builder(t, opt, r, prompt, 1000);
      for (int32_t id : ids)
        if (builder.push(id, 1.0, 1, 0, [&](const TokenEvent& e) {
              streamed += e.text;
              streamed_reasoning += e.reasoning;
            }))
          break;
      if (streamed != r.text || streamed_reasoning != r.reasoning) qFatal("streamed text differs from the result's");
      return r;
    };
    // Qwen3 thinking: <think>\n reasoning \n</think>\n\n answer. The
    // whitespace around the reasoning and before the answer is dropped.
    GenerateResult r = run({a}, {open, nl, a, sp, b, nl, close, nl, nl, ab, sp, a}, *tok.value());
    QCOMPARE(r.reasoning, std::string("a b"));
    QCOMPARE(r.text, std::string("ab a"));
    // Whitespace inside the reasoning stays, however it is split into tokens.
    r = run({a}, {open, a, sp, nl, sp, b, sp, close, a}, *tok.value());
    QCOMPARE(r.reasoning, std::string("a \n b"));
    QCOMPARE(r.text, std::string("a"));
    // Two blocks: one reasoning, a paragraph apart; an empty first block
    // (or one the prompt opened) leaves no blank lines in front.
    r = run({a}, {open, a, close, b, open, nl, b, nl, close, a}, *tok.value());
    QCOMPARE(r.reasoning, std::string("a\n\nb"));
    QCOMPARE(r.text, std::string("ba"));
    r = run({a}, {open, nl, nl, close, open, b, close, a}, *tok.value());
    QCOMPARE(r.reasoning, std::string("b"));
    r = run({a, open, nl}, {open, b, close, a}, *tok.value());
    QCOMPARE(r.reasoning, std::string("b"));
    // A closing tag with no block open (a model that reasons without its
    // opening tag): the text as written, all answer.
    r = run({a}, {a, close, b}, *tok.value());
    QVERIFY(r.reasoning.empty());
    QCOMPARE(r.text, std::string("a</think>b"));
    // A tag typed earlier in the prompt does not open a block for the reply.
    r = run({open, a, b}, {a, b}, *tok.value());
    QVERIFY(r.reasoning.empty());
    QCOMPARE(r.text, std::string("ab"));
    // Raw text (a completion, a notebook): tags and all, as written.
    r = run({a}, {open, a, close, b}, *tok.value(), {}, false);
    QVERIFY(r.reasoning.empty());
    QCOMPARE(r.text, std::string("<think>a</think>b"));
    // DeepSeek-R1: the prompt opened the block.
    r = run({a, open, nl}, {b, sp, a, close, nl, a}, *tok.value());
    QCOMPARE(r.reasoning, std::string("b a"));
    QCOMPARE(r.text, std::string("a"));
    // Qwen3 with thinking off: the prompt closed it.
    r = run({open, nl, nl, close, nl, nl}, {a, b}, *tok.value());
    QVERIFY(r.reasoning.empty());
    QCOMPARE(r.text, std::string("ab"));
    // A stop string inside the reasoning stops nothing; in the answer it does.
    r = run({a}, {open, b, a, close, a, b, a, a}, *tok.value(), {"ba"});
    QCOMPARE(r.reasoning, std::string("ba"));
    QCOMPARE(r.text, std::string("a"));
    QCOMPARE(r.metrics.stop_reason, StopReason::stop_string);
    // One tag alone in the vocabulary: no routing, all answer.
    auto half = make(false);
    QVERIFY2(half.is_ok(), half.status().message().c_str());
    r = run({a}, {open, a, b}, *half.value());
    QVERIFY(r.reasoning.empty());
    QCOMPARE(r.text, std::string("<think>ab"));
  }

  // max_token_text_bytes(): no text of B bytes encodes to fewer than
  // B / (max_token_text_bytes() / 2) tokens (the bound without its headroom),
  // on inputs built to make tokens as long as they get: every conformance
  // vector, runs of the longest tokens' texts (decoded and raw), literal
  // U+2581 runs (SentencePiece keeps them as markers, 3 bytes each: a bound
  // that counted a marker as one byte fails here), special tokens' texts
  // parsed as tokens. A vocabulary that drops bytes it cannot spell has none.
  void max_token_text_bytes_bounds_the_token_count() {
    std::vector<std::string> paths;
    for (const char* name : {"llama-spm", "gpt-2", "deepseek-coder"}) paths.push_back(vocab_path(name));
    paths.push_back(std::string(PHASELAB_TEST_DATA) + "/stories260K.gguf");
    for (const std::string& path : paths) {
      Loaded l = load(path);
      QVERIFY2(l.tok, path.c_str());
      const Tokenizer& tok = *l.tok;
      const size_t per = tok.max_token_text_bytes();
      QVERIFY2(per >= 2 && per % 2 == 0, path.c_str());
      size_t longest_raw = 0;
      std::vector<TokenId> ids(tok.n_vocab());
      for (TokenId id = 0; id < tok.n_vocab(); id++) {
        ids[id] = id;
        longest_raw = std::max(longest_raw, tok.token_text(id).size());
      }
      QVERIFY(per <= 2 * std::max<size_t>(longest_raw, 1));
      std::vector<std::string> inputs;
      if (std::filesystem::exists(path + ".inp")) {
        const std::string raw = read_file(path + ".inp");
        const std::string sep = "\n__ggml_vocab_test__\n";
        for (size_t pos = 0; pos < raw.size();) {
          const size_t next = std::min(raw.find(sep, pos), raw.size());
          inputs.push_back(raw.substr(pos, next - pos));
          pos = next + sep.size();
        }
      }
      std::sort(ids.begin(), ids.end(), [&](TokenId a, TokenId b) { return tok.token_text(a).size() > tok.token_text(b).size(); });
      std::string specials;
      for (int k = 0; k < 40 && k < tok.n_vocab(); k++) {
        std::string decoded, raw;
        for (int r = 0; r < 30; r++) {
          decoded += tok.token_to_piece(ids[k], true);
          raw += tok.token_text(ids[k]);
        }
        inputs.push_back(decoded);
        inputs.push_back(raw);
      }
      for (TokenId id = 0; id < tok.n_vocab(); id++)
        if (tok.token_attr(id) == TokenAttr::control || tok.token_attr(id) == TokenAttr::user_defined)
          specials += tok.token_text(id);
      inputs.push_back(specials);
      std::string markers, spaces(300, ' ');
      for (int r = 0; r < 300; r++) markers += "\xE2\x96\x81";
      inputs.push_back(markers);
      inputs.push_back(spaces);
      for (const std::string& text : inputs)
        for (bool parse_special : {false, true}) {
          const size_t n = tok.encode(text, false, parse_special).size();
          QVERIFY2(n * (per / 2) >= text.size(),
                   qPrintable(QString("%1: %2 bytes gave %3 tokens, bound %4 bytes per token: '%5'")
                                  .arg(QString::fromStdString(path)).arg(text.size()).arg(n).arg(per / 2)
                                  .arg(QString::fromStdString(printable(text.substr(0, 60))))));
        }
    }
    // {"a", "b", "ab"} without <unk>: "xyz" encodes to nothing, so no bound.
    auto tiny = from_writer(tiny_bpe_writer());
    QVERIFY(tiny.is_ok());
    QVERIFY(tiny.value()->encode("xyz", false, false).empty());
    QCOMPARE(tiny.value()->max_token_text_bytes(), size_t{0});
  }

  void malformed_vocab_refused() {
    {
      GgufWriter w = tiny_bpe_writer();
      w.set("tokenizer.ggml.token_type", GgufWriteValue::i32_array({1, 1}));
      auto t = from_writer(w);
      QVERIFY(!t.is_ok());
      QVERIFY2(t.status().message().find("token_type") != std::string::npos, t.status().message().c_str());
    }
    {
      GgufWriter w;
      w.set("tokenizer.ggml.model", GgufWriteValue::string("llama"));
      w.set("tokenizer.ggml.tokens", GgufWriteValue::string_array({"<unk>", "<s>", "</s>", "a"}));
      w.set("tokenizer.ggml.scores", GgufWriteValue::f32_array({0, 0, 0}));
      auto t = from_writer(w);
      QVERIFY(!t.is_ok());
      QVERIFY2(t.status().message().find("scores") != std::string::npos, t.status().message().c_str());
    }
    {
      GgufWriter w = tiny_bpe_writer();
      w.set("tokenizer.ggml.model", GgufWriteValue::string("bert"));
      auto t = from_writer(w);
      QVERIFY(!t.is_ok());
      QVERIFY2(t.status().message().find("bert") != std::string::npos, t.status().message().c_str());
    }
    {
      GgufWriter w;
      w.set("general.architecture", GgufWriteValue::string("llama"));
      auto t = from_writer(w);
      QVERIFY(!t.is_ok());
      QVERIFY2(t.status().message().find("tokenizer.ggml.model") != std::string::npos, t.status().message().c_str());
    }
  }

  void gemma_round_trip() {
    const GemmaPath found = find_gemma();
    if (!found.error.empty()) QFAIL(found.error.c_str());
    if (found.path.empty()) {
      QSKIP(("gemma-3-270m-q4_k_m.gguf not found (PHASELAB_DEFAULT_MODEL unset; not in " + user_model_dir() +
             " or /tmp/models; scripts/fetch-model.sh downloads it)").c_str());
    }
    const std::string& path = found.path;
    Loaded l = load(path);
    QVERIFY(l.tok);
    QCOMPARE(l.tok->kind(), Tokenizer::Kind::spm);

    const std::string text = "Hello world! Ünïcödé 你好 🙂\n  code()";
    const auto ids = l.tok->encode(text, false, false);
    QVERIFY(!ids.empty());
    QCOMPARE(l.tok->decode(ids), text);
    const auto with_bos = l.tok->encode(text, true, false);
    QCOMPARE(l.tok->decode(with_bos), text);

    const TokenId sot = l.tok->find_token("<start_of_turn>").value_or(-1);
    const TokenId eot = l.tok->find_token("<end_of_turn>").value_or(-1);
    QVERIFY(sot >= 0 && eot >= 0);
    const auto chat = l.tok->encode("<start_of_turn>user\nHi<end_of_turn>", false, true);
    QVERIFY(!chat.empty());
    QCOMPARE(chat.front(), sot);
    QCOMPARE(chat.back(), eot);
    QVERIFY(l.tok->is_eog(eot));
    QVERIFY(l.tok->is_eog(l.tok->eos()));
    QCOMPARE(l.tok->eot(), eot);
    // Without parse_special the markers are ordinary text.
    const auto plain = l.tok->encode("<start_of_turn>user", false, false);
    QVERIFY(std::find(plain.begin(), plain.end(), sot) == plain.end());

    // Tokens a model may emit that are not text: never in an answer's text
    // (a notebook continuation once saved "<start_of_image>"), while the
    // user-defined tokens that are text (HTML tags, whitespace runs) stay.
    for (const char* marker : {"<start_of_image>", "<end_of_image>", "<start_of_turn>", "<pad>"}) {
      const TokenId id = l.tok->find_token(marker).value_or(-1);
      QVERIFY2(id >= 0, marker);
      QVERIFY2(l.tok->is_special(id), marker);
      QCOMPARE(l.tok->token_to_piece(id), std::string());
      QCOMPARE(l.tok->token_to_piece(id, true), std::string(marker));
      IncrementalDetokenizer d(*l.tok);
      QCOMPARE(d.push(id) + d.flush(), std::string());
    }
    for (const char* text : {"<table>", "</div>", "\n\n", "   "}) {
      const TokenId id = l.tok->find_token(text).value_or(-1);
      QVERIFY2(id >= 0, text);
      QCOMPARE(l.tok->token_attr(id), TokenAttr::user_defined);
      QVERIFY2(!l.tok->is_special(id), text);
      QCOMPARE(l.tok->token_to_piece(id), std::string(text));
    }
  }
};

QTEST_APPLESS_MAIN(TestTokenizer)
#include "test_tokenizer.moc"
