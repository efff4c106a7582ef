// The CPU reference engine: agreement with an independent implementation
// (llama.cpp outputs recorded in tests/data/reference_greedy.tsv), and exact
// invariants on tiny models of every supported architecture.
#include <QtTest>

#include <fstream>
#include <sstream>

#include "phaselab/backend.h"
#include "phaselab/chat_template.h"
#include "phaselab/jinja.h"
#include "phaselab/session.h"
#include "phaselab/memory.h"
#include "phaselab/metrics.h"
#include "phaselab/prompt.h"
#include "phaselab/speculative.h"
#include "phaselab/throughput.h"
#include "runtime/request_rules.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;

namespace {

struct RefCase {
  std::string model, prompt;
  bool parse_special = false;
  int n_predict = 0;
  std::vector<int32_t> prompt_ids, generated;
  std::vector<double> margins;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> v;
  std::istringstream is(s);
  int32_t x;
  while (is >> x) v.push_back(x);
  return v;
}

std::string unescape(const std::string& s) {
  std::string o;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char c = s[++i];
      o += c == 'n' ? '\n' : c == 't' ? '\t' : c;
    } else {
      o += s[i];
    }
  }
  return o;
}

std::vector<RefCase> load_reference() {
  std::vector<RefCase> out;
  std::ifstream in(test_data("reference_greedy.tsv"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> c;
    std::string cell;
    std::istringstream ls(line);
    while (std::getline(ls, cell, '\t')) c.push_back(cell);
    if (c.size() < 6) continue;
    RefCase r;
    r.model = c[0];
    r.parse_special = c[1] == "1";
    r.prompt = unescape(c[2]);
    r.n_predict = std::stoi(c[3]);
    r.prompt_ids = parse_ids(c[4]);
    r.generated = parse_ids(c[5]);
    if (c.size() > 7) {
      std::istringstream ms(c[7]);
      double m;
      while (ms >> m) r.margins.push_back(m);
    }
    out.push_back(r);
  }
  return out;
}

enum class Kind { reference, fast, portable };

std::unique_ptr<Session> open_session(const std::string& path, int n_ctx = 256, int max_batch = 64, int threads = 2,
                                      Kind kind = Kind::reference) {
  auto m = Model::load(path);
  if (!m) qFatal("load %s: %s", path.c_str(), m.status().message().c_str());
  auto b = kind == Kind::reference ? make_cpu_reference_backend(*m, threads, max_batch)
                                   : make_cpu_backend(*m, threads, max_batch, kind == Kind::portable);
  if (!b) qFatal("%s", b.status().message().c_str());
  auto s = Session::create(*m, std::move(*b), n_ctx);
  if (!s) qFatal("%s", s.status().message().c_str());
  return std::move(*s);
}

// The default model is fetched by scripts/test.sh; in CI its absence is a
// failure, elsewhere the test says why it skips.
#define REQUIRE_DEFAULT_MODEL(path)                                                                   \
  const std::string path = default_model_path();                                                      \
  if (path.empty()) {                                                                                 \
    if (std::getenv("CI")) QFAIL("default model missing: scripts/fetch-model.sh should have fetched it"); \
    QSKIP("default model not fetched (run scripts/fetch-model.sh)");                                  \
  }

const char* kArchs[] = {"llama", "qwen2", "qwen3",  "qwen3moe", "qwen3moe-q4_k", "mixtral",
                        "gemma2", "gemma3", "phi3", "gpt-oss", "gpt-oss-mxfp4", "gpt-oss-mxfp4-wide"};

}  // namespace

class TestEngine : public QObject {
  Q_OBJECT
 private slots:
  // Too little memory: a refusal with the numbers, before anything is
  // allocated (a KV cache of twice the available memory).
  void too_little_memory_is_refused_with_the_numbers() {
    const uint64_t available = available_memory_bytes();
    QVERIFY2(available > 0, "MemAvailable is not readable here");
    TinySpec spec = tiny_spec("llama");
    spec.n_ctx_train = 1u << 30;
    const std::string path = write_tiny_model(spec, "tiny_huge_ctx.gguf");
    auto m = Model::load(path);
    QVERIFY(bool(m));
    const uint64_t per_token = KvCache::bytes_for((*m)->config(), 1 << 20) >> 20;
    const uint64_t want = std::min<uint64_t>(2 * available / std::max<uint64_t>(per_token, 1), (1u << 30) - 64);
    auto b = make_cpu_reference_backend(*m, 1, 8);
    QVERIFY(bool(b));
    const uint64_t rss_before = resident_memory_bytes();
    auto s = Session::create(*m, std::move(*b), static_cast<int>(want));
    QVERIFY(!s);
    QCOMPARE(s.status().code(), StatusCode::out_of_memory);
    const std::string msg = s.status().message();
    QVERIFY2(msg.find("MiB are available") != std::string::npos && msg.find("context size") != std::string::npos,
             msg.c_str());
    QVERIFY(resident_memory_bytes() < rss_before + (64ull << 20));  // nothing big was touched
  }

  // check_memory names the parts a need has and, where given, the caller's
  // hint (perplexity's logits: "lower -b"); the engine's hint otherwise.
  void a_refusal_names_its_parts_and_the_callers_hint() {
    MemoryNeed logits;
    logits.work = 3ull << 20;
    const Status st = check_memory(logits, 2ull << 20, "lower -b");
    QCOMPARE(st.code(), StatusCode::out_of_memory);
    QCOMPARE(st.message(), std::string("this needs about 3 MiB of memory (work buffers 3) and 2 MiB are available: lower -b"));
    QVERIFY(check_memory(logits, 3ull << 20, "lower -b"));
    QVERIFY(check_memory(logits, 0, "lower -b"));  // unknown: ok
    MemoryNeed engine{1ull << 20, 4ull << 20, 1ull << 20};
    QCOMPARE(check_memory(engine, 5ull << 20).message(),
             std::string("this needs about 6 MiB of memory (weights 1, KV cache 4, work buffers 1) and 5 MiB are "
                         "available: lower the context size (-c)"));
  }

  // The work memory counts a pass's activations for every row but logits
  // only for the rows that want them (a sequence's last, a verified
  // draft's kMaxSpecK + 1 at most), plus 3 rows per sequence to sample:
  // with Gemma 3's 262144-entry vocabulary, 512 rows of logits would be
  // 512 MiB no pass of a session holds.
  void the_work_memory_counts_the_logits_rows_a_pass_can_want() {
    ModelConfig c;
    c.n_vocab = 262144, c.n_ff = 2048, c.n_embd = 640;
    const uint64_t row = 4ull * c.n_vocab, act = 4ull * (4 * c.n_ff + 8 * c.n_embd);
    QCOMPARE(engine_memory_need(c, 0, 0, 512, 1).work, 512 * act + (kMaxSpecK + 1 + 3) * row);
    QCOMPARE(engine_memory_need(c, 0, 0, 64, 1).work, 64 * act + (kMaxSpecK + 1 + 3) * row);
    QCOMPARE(engine_memory_need(c, 0, 0, 16, 1).work, 16 * act + (16 + 3) * row);  // no more rows than the pass
    QCOMPARE(engine_memory_need(c, 0, 0, 512, 8).work, 512 * act + (264 + 24) * row);
    QCOMPARE(engine_memory_need(c, 0, 0, 512, 32).work, 512 * act + (512 + 96) * row);
  }

  // Loading and unloading a model many times leaks nothing.
  void load_and_unload_keep_memory_flat() {
    uint64_t rss_after_warmup = 0;
    std::vector<float> logits;
    for (int i = 0; i < 100; i++) {
      auto s = open_session(test_data("stories260K.gguf"), 128, 16, 1, i % 2 ? Kind::fast : Kind::reference);
      QVERIFY(s->eval({1, 400, 300}, &logits));
      if (i == 9) rss_after_warmup = resident_memory_bytes();
    }
    const uint64_t rss = resident_memory_bytes();
    QVERIFY2(rss < rss_after_warmup + (4ull << 20),
             qPrintable(QString("RSS grew from %1 to %2 KiB over 90 loads").arg(rss_after_warmup >> 10).arg(rss >> 10)));
  }

  // 1000 short generations with random settings: no error, no growth.
  void thousand_random_generations_keep_memory_flat() {
    auto s = open_session(test_data("stories260K.gguf"), 256, 16, 1, Kind::fast);
    auto lookup = make_prompt_lookup_draft();
    std::mt19937 rng(1234);
    auto uni = [&](float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); };
    const std::vector<int32_t> prompts[] = {{1, 400, 300, 450}, {1, 260, 261, 262, 263, 264}, {1}, {1, 500, 500, 500, 500}};
    uint64_t rss_after_warmup = 0;
    for (int i = 0; i < 1000; i++) {
      GenerateOptions o;
      o.n_predict = 1 + static_cast<int>(rng() % 8);
      o.sampling.temperature = rng() % 4 == 0 ? 0.f : uni(0.1f, 2.f);
      o.sampling.top_k = static_cast<int>(rng() % 60);
      o.sampling.top_p = uni(0.1f, 1.f);
      o.sampling.min_p = uni(0.f, 0.3f);
      o.sampling.repeat_penalty = uni(1.f, 1.5f);
      o.sampling.frequency_penalty = uni(0.f, 1.f);
      o.sampling.presence_penalty = uni(0.f, 1.f);
      o.sampling.seed = rng();
      o.use_kv_cache = rng() % 8 != 0;
      o.prefix_cache = rng() % 2 == 0;
      o.ignore_eos = rng() % 2 == 0;
      if (o.use_kv_cache && rng() % 4 == 0) {
        o.draft = lookup.get();
        o.spec_k = 1 + static_cast<int>(rng() % 6);
      }
      const auto& p = prompts[rng() % std::size(prompts)];
      auto r = s->generate(p, o);
      QVERIFY2(bool(r), qPrintable(QString("generation %1: %2").arg(i).arg(r.status().message().c_str())));
      QVERIFY(!r->tokens.empty() && static_cast<int>(r->tokens.size()) <= o.n_predict);
      if (i == 99) rss_after_warmup = resident_memory_bytes();
    }
    const uint64_t rss = resident_memory_bytes();
    QVERIFY2(rss < rss_after_warmup + (2ull << 20),
             qPrintable(QString("RSS grew from %1 to %2 KiB over 900 generations").arg(rss_after_warmup >> 10).arg(rss >> 10)));
  }

  void stories260k_greedy_matches_reference() {
    auto session = open_session(test_data("stories260K.gguf"));
    const Tokenizer& tok = session->model().tokenizer();
    for (const auto& r : load_reference()) {
      if (r.model != "stories260K.gguf") continue;
      const auto prompt = tok.encode(r.prompt, true, r.parse_special);
      QCOMPARE(prompt, r.prompt_ids);
      auto res = session->generate(prompt, greedy(r.n_predict));
      QVERIFY2(res.is_ok(), res.status().message().c_str());
      QCOMPARE(res->tokens, r.generated);
      QVERIFY(res->text.rfind(", there was a little girl named Lily. She loved to play outside in the park.", 0) == 0);
    }
  }

  // Teacher-forced over the reference's whole output: wherever the
  // reference's own top-2 margin is clear of numeric noise (8-bit activations
  // and an F16 KV cache in llama.cpp; float here), our argmax must agree.
  void gemma_agrees_with_reference_teacher_forced() {
    REQUIRE_DEFAULT_MODEL(path);
    auto session = open_session(path, 256, 64);
    const Tokenizer& tok = session->model().tokenizer();
    const int n_vocab = session->model().config().n_vocab;
    int checked = 0;
    for (const auto& r : load_reference()) {
      if (r.model.rfind("gemma", 0) != 0) continue;
      QCOMPARE(tok.encode(r.prompt, true, r.parse_special), r.prompt_ids);
      std::vector<int32_t> seq = r.prompt_ids;
      seq.insert(seq.end(), r.generated.begin(), r.generated.end());
      std::vector<float> logits(static_cast<size_t>(seq.size()) * n_vocab);
      session->kv().clear();
      QVERIFY(session->backend().forward(seq.data(), static_cast<int>(seq.size()), session->kv(), logits.data(), LogitsMode::all));
      const size_t np = r.prompt_ids.size();
      for (size_t k = 0; k < r.generated.size(); k++) {
        const float* l = logits.data() + (np - 1 + k) * n_vocab;
        const int32_t ours = argmax(l, n_vocab);
        if (k < r.margins.size() && r.margins[k] >= 0.5) {
          QVERIFY2(ours == r.generated[k],
                   qPrintable(QString("prompt '%1' step %2: reference %3 (margin %4), ours %5")
                                  .arg(QString::fromStdString(r.prompt)).arg(k).arg(r.generated[k]).arg(r.margins[k]).arg(ours)));
          checked++;
        }
      }
    }
    qInfo("%d steps with a clear reference margin compared, all equal", checked);
    QVERIFY2(checked >= 100, qPrintable(QString("only %1 steps compared").arg(checked)));
  }

  // Free-running greedy decode equals the reference token for token up to the
  // first step where the reference itself was within numeric noise.
  void gemma_greedy_matches_reference_until_a_near_tie() {
    REQUIRE_DEFAULT_MODEL(path);
    auto session = open_session(path, 256, 64);
    const Tokenizer& tok = session->model().tokenizer();
    int total = 0;
    for (const auto& r : load_reference()) {
      if (r.model.rfind("gemma", 0) != 0) continue;
      size_t clear = 0;
      while (clear < r.margins.size() && r.margins[clear] >= 0.1) clear++;
      auto res = session->generate(tok.encode(r.prompt, true, r.parse_special), greedy(static_cast<int>(clear)));
      if (clear == 0) continue;
      QVERIFY2(res.is_ok(), res.status().message().c_str());
      const std::vector<int32_t> want(r.generated.begin(), r.generated.begin() + static_cast<long>(clear));
      QCOMPARE(res->tokens, want);
      total += static_cast<int>(clear);
    }
    QVERIFY(total >= 20);
  }

  void gemma_chat_template_renders_turns() {
    const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}};
    QCOMPARE(apply_chat_template(ChatTemplateFamily::gemma, msgs),
             std::string("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                         "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"));
    QCOMPARE(apply_chat_template(ChatTemplateFamily::chatml, {{"user", "Hi"}}),
             std::string("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
    QCOMPARE(apply_chat_template(ChatTemplateFamily::llama3, {{"user", "Hi"}}),
             std::string("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"));
    QCOMPARE(apply_chat_template(ChatTemplateFamily::llama2, {{"system", "S"}, {"user", "Hi"}}),
             std::string("[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]"));
    QCOMPARE(detect_chat_template("{{ '<start_of_turn>' + role }}"), ChatTemplateFamily::gemma);
    QCOMPARE(detect_chat_template("{% for m in messages %}<|im_start|>"), ChatTemplateFamily::chatml);
    QCOMPARE(detect_chat_template("<|start_header_id|>"), ChatTemplateFamily::llama3);
    QCOMPARE(detect_chat_template("[INST]"), ChatTemplateFamily::llama2);
    QCOMPARE(detect_chat_template("{{ messages }}"), ChatTemplateFamily::plain);
    QCOMPARE(detect_chat_template("{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"), ChatTemplateFamily::phi3);
    QCOMPARE(detect_chat_template("{{ '<|user|>\n' + message['content'] + eos_token }}"), ChatTemplateFamily::plain);  // Zephyr
    QCOMPARE(chat_stop_strings(ChatTemplateFamily::phi3).front(), std::string("<|end|>"));
    for (ChatTemplateFamily f : chat_template_families())
      QCOMPARE(chat_template_family_from_name(chat_template_family_name(f)), std::optional(f));
    QVERIFY(!chat_template_family_from_name("jinja").has_value());
  }

  // The built-in Phi-3 rendering (the fallback when a template fails) is
  // Phi-3.5-mini's own template's text, as the Jinja interpreter renders it
  // (itself checked against jinja2 on that template in test_jinja).
  void phi3_family_renders_as_phi35_template() {
    std::ifstream in(test_data("chat-templates/microsoft-Phi-3.5-mini-instruct.jinja"));
    std::stringstream src;
    src << in.rdbuf();
    QVERIFY(src.str().size() > 100);
    QCOMPARE(detect_chat_template(src.str()), ChatTemplateFamily::phi3);
    const jinja::Template t(src.str());
    const std::vector<std::vector<ChatMessage>> convs = {
        {{"user", "Hi"}},
        {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}},
        {{"system", ""}, {"user", "Hi"}}};
    for (const auto& msgs : convs) {
      nlohmann::ordered_json ctx;
      ctx["messages"] = nlohmann::ordered_json::array();
      for (const auto& m : msgs) ctx["messages"].push_back({{"role", m.role}, {"content", m.content}});
      ctx["add_generation_prompt"] = true;
      ctx["bos_token"] = "<s>";
      ctx["eos_token"] = "<|endoftext|>";
      QCOMPARE(apply_chat_template(ChatTemplateFamily::phi3, msgs), t.render(ctx));
    }
  }

  // Base models get example exchanges before the conversation; a system
  // prompt replaces the preamble's first line but keeps the examples.
  void fewshot_transcript_for_base_models() {
    const std::string plain = apply_chat_template(ChatTemplateFamily::plain, {{"user", "Hi"}});
    const std::string fs = apply_chat_template(ChatTemplateFamily::plain_fewshot, {{"user", "Hi"}});
    QCOMPARE(plain, std::string("User: Hi\nAssistant:"));
    QVERIFY(fs.size() > plain.size() + 100);
    QVERIFY(fs.ends_with("\nUser: Hi\nAssistant:"));
    QVERIFY(fs.find("Assistant: A spider has eight legs.\n") != std::string::npos);
    const std::string sys = apply_chat_template(ChatTemplateFamily::plain_fewshot, {{"system", "You are a pirate."}, {"user", "Hi"}});
    QVERIFY(sys.starts_with("You are a pirate.\n\nUser: How many legs"));
    QVERIFY(sys.ends_with("\nUser: Hi\nAssistant:"));
    QCOMPARE(sys.find("System:"), std::string::npos);
    QCOMPARE(chat_stop_strings(ChatTemplateFamily::plain_fewshot), chat_stop_strings(ChatTemplateFamily::plain));
  }

  // A chat's next turn renders the answer as the GUI stored it (the text
  // streamed after "Assistant:", with the space the model generated first)
  // and must find the answer's tokens in the cache: before, "Assistant: "
  // plus " The..." doubled the space, and every turn prefilled the whole
  // previous answer again.
  void next_chat_turn_reuses_the_answer() {
    auto session = open_session(test_data("stories260K.gguf"), 512, 16, 1, Kind::fast);
    const Tokenizer& tok = session->model().tokenizer();
    std::vector<ChatMessage> msgs = {{"user", "Tell me about the park."}};
    const auto p1 = tok.encode(apply_chat_template(ChatTemplateFamily::plain, msgs), true, true);
    GenerateOptions opt = greedy(24);
    opt.stop = chat_stop_strings(ChatTemplateFamily::plain);
    auto first = session->generate(p1, opt);
    QVERIFY(first.is_ok());
    QVERIFY2(first->text.starts_with(" "), first->text.c_str());
    msgs.push_back({"assistant", first->text});
    msgs.push_back({"user", "And then?"});
    const auto p2 = tok.encode(apply_chat_template(ChatTemplateFamily::plain, msgs), true, true);
    auto second = session->generate(p2, greedy(4));
    QVERIFY(second.is_ok());
    // Everything up to where the answer's text ended (a stop string's
    // tokens, held back from the text, may differ).
    QVERIFY2(second->metrics.n_reused >= static_cast<int>(p1.size() + first->tokens.size()) - 4,
             qPrintable(QString("reused %1 of %2 + %3").arg(second->metrics.n_reused).arg(p1.size()).arg(first->tokens.size())));
  }

  void gemma_chat_prompt_tokenizes_turn_markers() {
    REQUIRE_DEFAULT_MODEL(path);
    auto m = Model::load(path);
    QVERIFY(m.is_ok());
    const Tokenizer& tok = (*m)->tokenizer();
    const auto ids = tok.encode(apply_chat_template(ChatTemplateFamily::gemma, {{"user", "What is the capital of France?"}}), true, true);
    for (const auto& r : load_reference())
      if (r.parse_special) QCOMPARE(ids, r.prompt_ids);  // the reference rendered the same turn by hand
    QVERIFY(tok.is_eog(*tok.find_token("<end_of_turn>")));
  }

  // The default model is the base (pre-trained) Gemma 3 270M and has no chat
  // template, so chat uses the few-shot transcript; its answer must name
  // Paris (which no example mentions). (With Gemma's turn markers the base model only repeats the
  // question, in llama.cpp as here: see the reference file.)
  void gemma_chat_answer_names_paris() {
    REQUIRE_DEFAULT_MODEL(path);
    auto session = open_session(path, 256, 64);
    const Model& m = session->model();
    QCOMPARE(m.chat_template(), ChatTemplateFamily::plain_fewshot);
    QVERIFY(!m.has_chat_template());
    const auto prompt = m.tokenizer().encode(
        apply_chat_template(m.chat_template(), {{"user", "What is the capital of France?"}}), true, true);
    GenerateOptions o = greedy(32);
    o.ignore_eos = false;
    o.stop = chat_stop_strings(m.chat_template());
    auto r = session->generate(prompt, o);
    QVERIFY2(r.is_ok(), r.status().message().c_str());
    QVERIFY2(r->text.find("Paris") != std::string::npos, r->text.c_str());
  }

  void kv_cache_on_equals_off_data() {
    QTest::addColumn<QString>("arch");
    QTest::addColumn<int>("kind");
    for (const char* a : kArchs) {
      QTest::newRow((std::string(a) + "/reference").c_str()) << a << int(Kind::reference);
      QTest::newRow((std::string(a) + "/fast").c_str()) << a << int(Kind::fast);
    }
  }
  void kv_cache_on_equals_off() {
    QFETCH(QString, arch);
    QFETCH(int, kind);
    const std::string path = write_tiny_model(tiny_spec(arch.toStdString()), "tiny_kv_" + arch.toStdString() + ".gguf");
    auto s = open_session(path, 64, 5, 2, Kind(kind));  // batch 5: prompts span several chunks
    const std::vector<int32_t> prompt = {1, 260, 261, 262, 263, 264, 100, 101, 102, 103, 104};
    auto on = s->generate(prompt, greedy(20));
    QVERIFY2(on.is_ok(), on.status().message().c_str());
    GenerateOptions off = greedy(20);
    off.use_kv_cache = false;
    auto no = s->generate(prompt, off);
    QVERIFY(no.is_ok());
    QCOMPARE(on->tokens, no->tokens);
    QCOMPARE(on->text, no->text);
  }

  void batched_prefill_equals_token_by_token_data() {
    kv_cache_on_equals_off_data();
    // A real model whose n_ff (172) is not a multiple of the SIMD width.
    QTest::newRow("stories260K/reference") << "stories260K" << int(Kind::reference);
    QTest::newRow("stories260K/fast") << "stories260K" << int(Kind::fast);
    // Gemma 3 270M: the repacked kernels of every format it has (Q5_0 rows of
    // 640 with their half groups, Q8_0, Q4_K, Q6_K), whose tiles of 4 and 8
    // tokens (paired with AVX-512) a 45-token prompt runs.
    QTest::newRow("gemma3-270m/fast") << "default" << int(Kind::fast);
    // The same in passes of 16 tokens (16, 16, 13): the path of a decode
    // batch, where packed rows (Q5_0 on AVX-512) are unpacked row pair by
    // row pair rather than in blocks.
    QTest::newRow("gemma3-270m/fast, 16-token passes") << "default/16" << int(Kind::fast);
    // Passes of more than 32 tokens take the row tiles (AVX-512: Q8_0 rows
    // of 256 and 512): products that are all whole tiles skip the groups,
    // and the 40-row K and V leave rows to the other kernels.
    QTest::newRow("qwen3-wide/fast, 45 tokens") << "qwen3-wide/45" << int(Kind::fast);
  }
  void batched_prefill_equals_token_by_token() {
    QFETCH(QString, arch);
    QFETCH(int, kind);
    std::string path;
    int n_prompt = 13, pass = 64;
    if (arch == "stories260K") {
      path = test_data("stories260K.gguf");
    } else if (arch.startsWith("default")) {
      if (arch == "default/16") pass = 16;
      path = default_model_path();
      if (path.empty()) {
        if (std::getenv("CI")) QFAIL("default model missing");
        QSKIP("default model not fetched (run scripts/fetch-model.sh)");
      }
      n_prompt = 45;
    } else {
      const QString name = arch.section('/', 0, 0);  // "qwen3-wide/45": 45 prompt tokens
      if (arch.contains('/')) n_prompt = arch.section('/', 1, 1).toInt();
      path = write_tiny_model(tiny_spec(name.toStdString()), "tiny_batch_" + name.toStdString() + ".gguf");
    }
    auto batched = open_session(path, 64, pass, 2, Kind(kind));
    auto single = open_session(path, 64, 1, 2, Kind(kind));
    std::vector<int32_t> prompt;
    for (int i = 0; i < n_prompt; i++) prompt.push_back(1 + (i * 37) % 270);
    std::vector<float> a, b;
    QVERIFY(batched->eval(prompt, &a));
    QVERIFY(single->eval(prompt, &b));
    QCOMPARE(a.size(), b.size());
    QVERIFY2(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "logits differ bitwise");
  }

  // The fast backend against the reference: logits by NMSE (8-bit
  // activations cost precision, within 5e-4) and the same greedy tokens.
  void fast_backend_matches_reference_data() {
    QTest::addColumn<QString>("model");
    QTest::addColumn<int>("kind");
    for (const char* a : kArchs) {
      QTest::newRow((std::string(a) + "/fast").c_str()) << a << int(Kind::fast);
      QTest::newRow((std::string(a) + "/portable").c_str()) << a << int(Kind::portable);
    }
    QTest::newRow("stories260K/fast") << "stories260K" << int(Kind::fast);
    QTest::newRow("gemma3-270m/fast") << "default" << int(Kind::fast);
  }
  void fast_backend_matches_reference() {
    QFETCH(QString, model);
    QFETCH(int, kind);
    std::string path;
    std::vector<int32_t> prompt;
    int n_gen = 24;
    if (model == "stories260K") {
      path = test_data("stories260K.gguf");
      prompt = {1, 403, 407, 261, 378};
    } else if (model == "default") {
      path = default_model_path();
      if (path.empty()) {
        if (std::getenv("CI")) QFAIL("default model missing");
        QSKIP("default model not fetched (run scripts/fetch-model.sh)");
      }
      prompt = {2, 2063, 10779, 78113, 236769, 236749, 1473};  // "def fibonacci(n):"
      n_gen = 12;
    } else {
      path = write_tiny_model(tiny_spec(model.toStdString()), "tiny_fast_" + model.toStdString() + ".gguf");
      prompt = {1, 260, 261, 262, 263, 100, 101};
    }
    auto ref = open_session(path, 256, 64, 2, Kind::reference);
    auto fast = open_session(path, 256, 64, 2, Kind(kind));
    std::vector<float> a, b;
    QVERIFY(ref->eval(prompt, &a));
    QVERIFY(fast->eval(prompt, &b));
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
      num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
      den += static_cast<double>(a[i]) * a[i];
    }
    const double nmse = num / den;
    qInfo("logits NMSE fast vs reference: %.3g", nmse);
    QVERIFY2(nmse <= 5e-4, qPrintable(QString("NMSE %1").arg(nmse)));
    // Greedy tokens: free-running equality on the real small model; on the
    // random tiny models (flat distributions, near-ties everywhere) teacher-
    // forced: the fast argmax must agree wherever the reference's own top-2
    // margin exceeds a tenth of the logits' standard deviation.
    ref->kv().clear();
    auto gr = ref->generate(prompt, greedy(n_gen));
    QVERIFY(gr.is_ok());
    if (model == "stories260K") {
      fast->kv().clear();
      auto gf = fast->generate(prompt, greedy(n_gen));
      QVERIFY(gf.is_ok());
      QCOMPARE(gf->tokens, gr->tokens);
    }
    std::vector<int32_t> seq = prompt;
    seq.insert(seq.end(), gr->tokens.begin(), gr->tokens.end() - 1);
    const int nv = ref->model().config().n_vocab;
    std::vector<float> la(seq.size() * nv), lb(seq.size() * nv);
    ref->kv().clear();
    fast->kv().clear();
    QVERIFY(ref->backend().forward(seq.data(), static_cast<int>(seq.size()), ref->kv(), la.data(), LogitsMode::all));
    QVERIFY(fast->backend().forward(seq.data(), static_cast<int>(seq.size()), fast->kv(), lb.data(), LogitsMode::all));
    int compared = 0;
    for (size_t p = prompt.size() - 1; p < seq.size(); p++) {
      const float* l = la.data() + p * nv;
      const int32_t top = argmax(l, nv);
      float second = -INFINITY;
      double sum = 0, sq = 0;
      for (int i = 0; i < nv; i++) {
        if (i != top) second = std::max(second, l[i]);
        sum += l[i];
        sq += static_cast<double>(l[i]) * l[i];
      }
      const double sd = std::sqrt(std::max(0.0, sq / nv - (sum / nv) * (sum / nv)));
      if (l[top] - second < 0.1 * sd) continue;
      QCOMPARE(argmax(lb.data() + p * nv, nv), top);
      compared++;
    }
    QVERIFY(compared >= n_gen / 2);
  }

  void same_seed_same_text() {
    const std::string path = write_tiny_model(tiny_spec("llama"), "tiny_seed.gguf");
    auto s = open_session(path);
    GenerateOptions o;
    o.n_predict = 24;
    o.ignore_eos = true;
    o.sampling.temperature = 1.0f;
    o.sampling.seed = 1234;
    auto a = s->generate({1, 260, 261}, o);
    auto b = s->generate({1, 260, 261}, o);
    QVERIFY(a.is_ok() && b.is_ok());
    QCOMPARE(a->tokens, b->tokens);
    o.sampling.seed = 99;
    auto c = s->generate({1, 260, 261}, o);
    QVERIFY(c.is_ok());
    QVERIFY2(c->tokens != a->tokens, "another seed should give another sample on a random model");
  }

  // A local (sliding-window) layer must not see keys window or more
  // positions back: with every layer local, the logits at position p depend
  // only on the last `window` tokens.
  void sliding_window_masks_old_keys() {
    TinySpec spec = tiny_spec("gemma3");
    spec.swa_period = 1000;  // all layers local
    spec.sliding_window = 3;
    spec.n_layer = 1;  // one layer: its receptive field is exactly the window
    const std::string path = write_tiny_model(spec, "tiny_swa.gguf");
    auto s = open_session(path, 64, 64);
    std::vector<float> a, b, c;
    QVERIFY(s->eval({1, 270, 271, 272, 273, 274, 275}, &a));
    s->kv().clear();
    QVERIFY(s->eval({1, 100, 101, 102, 273, 274, 275}, &b));  // differs only outside the window
    QVERIFY2(a == b, "a local layer saw a key outside its window");
    s->kv().clear();
    QVERIFY(s->eval({1, 270, 271, 272, 200, 274, 275}, &c));  // differs inside the window
    QVERIFY(a != c);
  }

  void prefix_reuse_equals_cold_prefill() {
    const std::string path = write_tiny_model(tiny_spec("qwen3"), "tiny_prefix.gguf");
    auto s = open_session(path, 128, 4);
    const std::vector<int32_t> turn1 = {1, 260, 261, 262, 263, 264, 265};
    auto r1 = s->generate(turn1, greedy(5));
    QVERIFY(r1.is_ok());
    std::vector<int32_t> turn2 = turn1;
    turn2.insert(turn2.end(), r1->tokens.begin(), r1->tokens.end());
    turn2.insert(turn2.end(), {266, 267, 268});
    auto warm = s->generate(turn2, greedy(8));
    QVERIFY(warm.is_ok());
    QVERIFY2(warm->metrics.n_reused >= static_cast<int>(turn1.size()), "the common prefix was not reused");
    auto cold_session = open_session(path, 128, 4);
    auto cold = cold_session->generate(turn2, greedy(8));
    QVERIFY(cold.is_ok());
    QCOMPARE(cold->metrics.n_reused, 0);
    QCOMPARE(warm->tokens, cold->tokens);
  }

  void prompt_longer_than_context_is_an_error_with_a_hint() {
    const std::string path = write_tiny_model(tiny_spec("llama"), "tiny_ctx.gguf");
    auto s = open_session(path, 16);
    std::vector<int32_t> prompt(20, 260);
    auto r = s->generate(prompt, greedy(4));
    QVERIFY(!r.is_ok());
    QCOMPARE(r.status().code(), StatusCode::context_full);
    QVERIFY(r.status().message().find("context size") != std::string::npos);
    // Generation that reaches the end of the context stops cleanly.
    auto full = s->generate(std::vector<int32_t>(10, 260), greedy(100));
    QVERIFY(full.is_ok());
    QCOMPARE(std::string(to_string(full->metrics.stop_reason)), std::string("context_full"));
    QCOMPARE(static_cast<int>(full->tokens.size()), 6);
  }

  void cancel_stops_between_steps() {
    const std::string path = write_tiny_model(tiny_spec("llama"), "tiny_cancel.gguf");
    auto s = open_session(path, 128);
    std::atomic<bool> cancel{false};
    int seen = 0;
    auto r = s->generate({1, 260}, greedy(50), [&](const TokenEvent&) {
      if (++seen == 3) cancel = true;
    }, &cancel);
    QVERIFY(r.is_ok());
    QCOMPARE(std::string(to_string(r->metrics.stop_reason)), std::string("cancelled"));
    QCOMPARE(static_cast<int>(r->tokens.size()), 3);
  }

  void stop_string_ends_generation_and_is_not_shown() {
    auto s = open_session(test_data("stories260K.gguf"));
    GenerateOptions o = greedy(64);
    o.stop = {"Lily"};
    std::string streamed;
    auto r = s->generate(s->model().tokenizer().encode("Once upon a time", true, false), o,
                         [&](const TokenEvent& e) { streamed += e.text; });
    QVERIFY(r.is_ok());
    QCOMPARE(std::string(to_string(r->metrics.stop_reason)), std::string("stop_string"));
    QCOMPARE(r->text, std::string(", there was a little girl named "));
    QCOMPARE(streamed, r->text);
  }

  // Text held back as a possible stop string's beginning belongs to the
  // answer when the answer ends by its length: streamed and final text keep
  // it.
  void held_back_text_is_kept_when_the_length_ends_the_answer() {
    auto s = open_session(test_data("stories260K.gguf"));
    const auto prompt = s->model().tokenizer().encode("Once upon a time", true, false);
    auto plain = s->generate(prompt, greedy(12));
    QVERIFY(plain.is_ok());
    QVERIFY(plain->text.size() > 3);
    GenerateOptions o = greedy(12);
    // A stop string that the answer's last characters begin and never complete.
    o.stop = {plain->text.substr(plain->text.size() - 3) + "\x01"};
    std::string streamed;
    auto r = s->generate(prompt, o, [&](const TokenEvent& e) { streamed += e.text; });
    QVERIFY(r.is_ok());
    QCOMPARE(std::string(to_string(r->metrics.stop_reason)), std::string("length"));
    QCOMPARE(r->text, plain->text);
    QCOMPARE(streamed, r->text);
  }

  void metrics_follow_their_definitions() {
    auto s = open_session(test_data("stories260K.gguf"));
    auto r = s->generate(s->model().tokenizer().encode("Once upon a time", true, false), greedy(16));
    QVERIFY(r.is_ok());
    const RequestMetrics& m = r->metrics;
    QCOMPARE(m.n_prompt, 5);
    QCOMPARE(m.n_generated, 16);
    QVERIFY(m.ttft_ms > 0 && m.prefill_tps > 0 && m.decode_tps > 0);
    QVERIFY(std::abs(m.tpot_ms * m.decode_tps - 1000.0) < 1e-6);
    QVERIFY(std::abs(m.decode_tps - 15 / (m.decode_ms / 1000.0)) < 1e-6);
    QCOMPARE(std::string(to_string(m.stop_reason)), std::string("length"));
  }

  // render_prompt is every front end's prompt: a chat through the template
  // (markers parsed, the template's stop strings), a text as written.
  void render_prompt_is_the_template_or_the_text() {
    auto m = shared_stories();
    const Tokenizer& tok = m->tokenizer();
    const std::vector<ChatMessage> turns = {{"user", "Tell me about the park."}};
    const RenderedPrompt chat = render_prompt(tok, ChatTemplateFamily::plain, PromptInput::chat_of(turns, "Be brief."));
    QCOMPARE(chat.tokens, tok.encode(apply_chat_template(ChatTemplateFamily::plain,
                                                         {{"system", "Be brief."}, {"user", "Tell me about the park."}}),
                                     true, true));
    QCOMPARE(chat.stop, chat_stop_strings(ChatTemplateFamily::plain));
    QCOMPARE(PromptInput::chat_of(turns, "Be brief.").conversation().size(), size_t{2});
    QCOMPARE(PromptInput::chat_of(turns).conversation().size(), size_t{1});
    const RenderedPrompt text = render_prompt(tok, ChatTemplateFamily::plain, PromptInput::text_of("Once upon a time"));
    QCOMPARE(text.tokens, tok.encode("Once upon a time", true, false));
    QVERIFY(text.stop.empty());
    // The size check sees the rendered text before it is encoded.
    size_t seen = 0;
    auto refused = render_prompt(tok, ChatTemplateFamily::plain, PromptInput::text_of("Once"), [&](size_t bytes) {
      seen = bytes;
      return false;
    });
    QVERIFY(!refused.has_value());
    QCOMPARE(seen, size_t{4});
  }

  // Speculative decoding reads the weights once per target pass, not once
  // per token: a run of 3.67 tokens per pass used 1/3.67 of the bandwidth
  // the same tokens/s would take one pass each (issue 31: "25.6 GB/s of 6.2").
  void decode_bandwidth_counts_target_passes() {
    const double weights = 241.0 * (1 << 20);
    const PhaseLoad one = decode_load(weights, 106, 1, 16.4e9);
    const PhaseLoad spec = decode_load(weights, 106, 3.67, 16.4e9);
    QVERIFY(qAbs(spec.fraction - one.fraction / 3.67) < 1e-12);
    QVERIFY(qAbs(spec.achieved - weights * 106 / 3.67) < 1);
    QCOMPARE(spec.tokens_per_pass, 3.67);
    QCOMPARE(target_passes_per_s(106, 3.67), 106 / 3.67);
    // Not counted yet (0) or below 1: a pass is at least one token.
    QCOMPARE(decode_load(weights, 106, 0, 16.4e9).fraction, one.fraction);
    QCOMPARE(target_passes_per_s(106, 0.5), 106.0);
  }

  // Prefill's roofline: a pass reads every weight once, so a short prompt is
  // memory-bound and its fraction is of the bandwidth, not of a compute peak
  // it could never reach (issue 31: "Prefill: compute 1%" after 11 tokens).
  void prefill_is_held_against_the_bound_that_applies() {
    const double weights = 241.0 * (1 << 20), ops = 2 * 100e6, bandwidth = 16.4e9;
    const ComputePeak peak = int8_or_fp32_peak(true, 400e9, 100e9);
    const double balance = prefill_balance_tokens(weights, ops, bandwidth, peak);
    // Reading the weights takes as long as `balance` tokens of work.
    QVERIFY(qAbs(weights / bandwidth - balance * ops / peak.ops_per_s) < 1e-12);
    QVERIFY(balance > 11 && balance < 64);
    PrefillRun run;
    run.ops_per_token = ops;
    run.weight_bytes = weights;
    run.max_pass_tokens = 64;
    // 11 tokens in one pass at 400 tokens/s: 36 passes/s reading 241 MiB each.
    run.n_tokens = 11;
    run.tokens_per_s = 400;
    const PhaseLoad shortPrompt = prefill_load(run, peak, bandwidth);
    QVERIFY(!shortPrompt.compute);
    QCOMPARE(shortPrompt.peak, bandwidth);
    QVERIFY(qAbs(shortPrompt.achieved - weights * 400 / 11) < 1);
    QVERIFY(qAbs(shortPrompt.fraction - weights * 400 / 11 / bandwidth) < 1e-12);
    QVERIFY(shortPrompt.fraction > 0.4 && shortPrompt.fraction < 1);  // not the compute peak's 20%
    QCOMPARE(shortPrompt.tokens_per_pass, 11.0);
    QCOMPARE(shortPrompt.balance_tokens, balance);
    // 512 tokens in passes of 64: each pass is past the balance.
    run.n_tokens = 512;
    run.tokens_per_s = 1000;
    const PhaseLoad longPrompt = prefill_load(run, peak, bandwidth);
    QVERIFY(longPrompt.compute && longPrompt.int8);
    QCOMPARE(longPrompt.tokens_per_pass, 64.0);
    QVERIFY(qAbs(longPrompt.fraction - ops * 1000 / 400e9) < 1e-12);
    // A prompt of two unequal passes counts them at their mean length.
    run.n_tokens = 100;
    QCOMPARE(prefill_tokens_per_pass(run), 50.0);
    run.max_pass_tokens = 0;  // one pass, whatever the length
    QCOMPARE(prefill_tokens_per_pass(run), 100.0);
    // A peak unknown: no balance.
    QCOMPARE(prefill_balance_tokens(weights, ops, 0, peak), 0.0);
  }

  // The engine decides what a rate means: which peak, and the fraction.
  void metrics_choose_the_peak_and_divide() {
    QVERIFY(multiplies_in_int8("cpu-avx2"));
    QVERIFY(multiplies_in_int8("cpu-portable"));
    QVERIFY(!multiplies_in_int8("cpu-reference"));
    QVERIFY(!multiplies_in_int8("cuda"));
    QVERIFY(compute_peak("cpu-avx2", 800e9, 100e9).int8);
    QCOMPARE(compute_peak("cpu-avx2", 800e9, 100e9).ops_per_s, 800e9);
    QCOMPARE(compute_peak("cpu-avx2", 0, 100e9).ops_per_s, 100e9);  // int8 not measured: FP32
    QCOMPARE(compute_peak("cpu-reference", 800e9, 100e9).ops_per_s, 100e9);
    QCOMPARE(compute_peak("cuda", 800e9, 100e9).ops_per_s, 100e9);
    QCOMPARE(compute_peak(std::string("cpu-reference"), 800e9, 100e9).ops_per_s, 100e9);
    QVERIFY(!int8_or_fp32_peak(false, 800e9, 100e9).int8);
    const PhaseLoad d = decode_load(1e9, 20, 1, 40e9);
    QCOMPARE(d.achieved, 20e9);
    QCOMPARE(d.fraction, 0.5);
    QVERIFY(!d.compute);
    QCOMPARE(decode_load(1e9, 20, 1, 0).fraction, 0.0);  // no peak: no fraction
    // Without a bandwidth the prefill is held against the compute peak.
    PrefillRun run;
    run.ops_per_token = 2e6;
    run.weight_bytes = 1e6;
    run.n_tokens = 512;
    run.tokens_per_s = 1000;
    const PhaseLoad p = prefill_load(run, int8_or_fp32_peak(true, 8e9, 1e9), 0);
    QCOMPARE(p.fraction, 0.25);
    QVERIFY(p.compute && p.int8);
    QCOMPARE(recomputed_positions(100, 10, false), 110.0);
    QCOMPARE(recomputed_positions(100, 10, true), 105.0);
    auto m = shared_stories();
    uint64_t all = 0;
    double blocks = 0;
    for (const auto& t : m->file().tensors()) {
      all += t.n_elements;
      if (t.name.rfind("blk.", 0) == 0 && t.n_dims == 2) blocks += 2.0 * static_cast<double>(t.n_elements);
    }
    QCOMPARE(parameter_count(*m), all);
    QCOMPARE(prefill_ops_per_token(*m), blocks);
    QCOMPARE(decode_ops_per_token(*m), blocks + 2.0 * m->config().n_vocab * m->config().n_embd);
  }

  void enums_spell_what_users_and_flags_see() {
    QCOMPARE(std::string(to_string(Phase::prefill)), std::string("prefill"));
    QCOMPARE(std::string(to_string(Phase::decode)), std::string("decode"));
    QCOMPARE(std::string(to_string(Phase::done)), std::string("done"));
    for (SpeculativeMode mode : {SpeculativeMode::off, SpeculativeMode::prompt_lookup, SpeculativeMode::draft_model})
      QCOMPARE(speculative_mode_from_string(to_string(mode)), std::optional(mode));
    QCOMPARE(std::string(to_string(SpeculativeMode::off)), std::string("none"));
    QCOMPARE(make_prompt_lookup_draft()->name(), std::string(to_string(SpeculativeMode::prompt_lookup)));
    QVERIFY(!speculative_mode_from_string("ngram").has_value());
  }

  // measure_pp_tg: one warm-up, then the timed runs; tg through generate
  // when asked; a set cancel flag stops it before a run.
  void measure_pp_tg_times_the_runs() {
    auto s = open_session(test_data("stories260K.gguf"));
    ThroughputRun run;
    run.tokens = s->model().tokenizer().encode("Once upon a time there was", true, false);
    run.depth = {1, 2, 3};
    run.repetitions = 3;
    std::vector<int> seen;
    run.on_run = [&](int r) { seen.push_back(r); };
    auto pp = measure_pp_tg(*s, run);
    QVERIFY2(pp.is_ok(), pp.status().message().c_str());
    QCOMPARE(seen, (std::vector<int>{0, 1, 2, 3}));
    QCOMPARE(pp->samples.size(), size_t{3});
    QVERIFY(pp->mean > 0 && pp->sd >= 0);
    QCOMPARE(s->kv().n_past(), static_cast<int>(run.depth.size() + run.tokens.size()));
    run.test = ThroughputTest::tg;
    run.depth.clear();
    GenerateOptions g = greedy(8);
    run.generate = &g;
    auto tg = measure_pp_tg(*s, run);
    QVERIFY2(tg.is_ok(), tg.status().message().c_str());
    QVERIFY(tg->mean > 0);
    std::atomic<bool> cancel{true};
    run.cancel = &cancel;
    QCOMPARE(measure_pp_tg(*s, run).status().code(), StatusCode::cancelled);
  }

  // measure_ab: both states timed in every run (tg token by token, pp run
  // by run), one sample each per timed run; the backend left in state a;
  // refused for generate and where the backend has no switches.
  void measure_ab_times_both_states_in_every_run() {
    auto s = open_session(test_data("stories260K.gguf"), 256, 16, 2, Kind::fast);
    ThroughputRun run;
    run.tokens = s->model().tokenizer().encode("Once upon a time there was", true, false);
    run.depth = {1, 2};
    run.repetitions = 3;
    CpuSwitches a, b;
    a.decode_rows = false;
    b.decode_rows = true;
    for (ThroughputTest test : {ThroughputTest::pp, ThroughputTest::tg}) {
      run.test = test;
      std::vector<int> seen;
      run.on_run = [&](int r) { seen.push_back(r); };
      auto ab = measure_ab(*s, run, a, b);
      QVERIFY2(ab.is_ok(), ab.status().message().c_str());
      QCOMPARE(seen, (std::vector<int>{0, 1, 2, 3}));
      QCOMPARE(ab->a.samples.size(), size_t{3});
      QCOMPARE(ab->b.samples.size(), size_t{3});
      QVERIFY(ab->a.mean > 0 && ab->b.mean > 0);
      QCOMPARE(s->kv().n_past(), static_cast<int>(run.depth.size() + run.tokens.size()));
    }
    GenerateOptions g = greedy(4);
    run.generate = &g;
    QCOMPARE(measure_ab(*s, run, a, b).status().code(), StatusCode::invalid_argument);
    run.generate = nullptr;
    auto ref = open_session(test_data("stories260K.gguf"), 256, 16, 1, Kind::reference);
    QCOMPARE(measure_ab(*ref, run, a, b).status().code(), StatusCode::unsupported);
  }

  void unsupported_architecture_is_refused_by_name() {
    for (const std::string arch : {"mamba", "deepseek2"}) {
      GgufWriter w;
      int n_vocab;
      add_tiny_vocab(w, &n_vocab);
      w.set("general.architecture", GgufWriteValue::string(arch));
      const QString path = QDir::temp().filePath(QString::fromStdString("tiny_" + arch + ".gguf"));
      QVERIFY(w.write(path.toStdString()));
      auto m = Model::load(path.toStdString());
      QVERIFY(!m.is_ok());
      QCOMPARE(m.status().code(), StatusCode::unsupported);
      QVERIFY(m.status().message().find("'" + arch + "'") != std::string::npos);
      QVERIFY2(m.status().message().find("qwen3moe") != std::string::npos, m.status().message().c_str());  // what runs
    }
  }

  // RoPE scaling keys: linear and YaRN scale (Gemma 3: the global layers
  // only; Gemma 2 and gpt-oss: all); a factor of 1 scales nothing whatever
  // the type; an unknown type that would scale is refused by name, and so
  // are a YaRN factor below 1 and a factor out of range.
  void rope_scaling_keys_are_read_as_llama_cpp_does() {
    auto config = [](const std::string& arch, const char* type, float factor) {
      TinySpec s = tiny_spec(arch);
      s.yarn_factor = factor;
      s.rope_scaling = type;
      return Model::load(write_tiny_model(s, "tiny_rope_scaling.gguf"));
    };
    auto g3 = config("gemma3", "linear", 8);
    QVERIFY2(g3.is_ok(), g3.status().message().c_str());
    QCOMPARE((*g3)->config().rope_freq_scale, 0.125f);
    QCOMPARE((*g3)->config().rope_freq_scale_swa, 1.f);
    QCOMPARE((*g3)->config().rope_freq_scale_of(0), 1.f);  // layer 0 is local
    QCOMPARE((*g3)->config().rope_freq_scale_of(1), 0.125f);
    auto oss = config("gpt-oss", "yarn", 32);
    QVERIFY2(oss.is_ok(), oss.status().message().c_str());
    QCOMPARE((*oss)->config().rope_freq_scale_swa, 1.f / 32);
    QCOMPARE((*oss)->config().yarn_ext_factor, 1.f);
    for (const char* type : {"yarn", "longrope", "dynamic"}) {
      auto one = config("llama", type, 1);
      QVERIFY2(one.is_ok(), one.status().message().c_str());
      QVERIFY(!(*one)->config().rope_scaled());
    }
    auto unknown = config("llama", "dynamic", 2);
    QCOMPARE(unknown.status().code(), StatusCode::unsupported);
    QVERIFY2(unknown.status().message().find("'dynamic'") != std::string::npos, unknown.status().message().c_str());
    QCOMPARE(config("llama", "yarn", 0.5f).status().code(), StatusCode::invalid_file);
    QCOMPARE(config("llama", "linear", 1e-6f).status().code(), StatusCode::invalid_file);
  }

  void unsupported_tensor_type_is_refused_by_name() {
    // A valid file whose embedding is Q2_K, a type PhaseLab reads but cannot
    // compute with yet.
    GgufWriter w;
    int n_vocab;
    add_tiny_vocab(w, &n_vocab);
    w.set("general.architecture", GgufWriteValue::string("llama"));
    w.set("llama.embedding_length", GgufWriteValue::u32(256));
    w.set("llama.block_count", GgufWriteValue::u32(1));
    w.set("llama.feed_forward_length", GgufWriteValue::u32(256));
    w.set("llama.attention.head_count", GgufWriteValue::u32(4));
    std::vector<uint8_t> q2(84 * n_vocab, 0);
    QVERIFY(w.add_tensor("token_embd.weight", TensorType::Q2_K, {256, n_vocab}, q2.data(), q2.size()));
    const QString path = QDir::temp().filePath("tiny_q2k_bad.gguf");
    QVERIFY(w.write(path.toStdString()));
    auto m = Model::load(path.toStdString());
    QVERIFY(!m.is_ok());
    QVERIFY2(m.status().message().find("Q2_K") != std::string::npos, m.status().message().c_str());
  }
};

QTEST_APPLESS_MAIN(TestEngine)
#include "test_engine.moc"
