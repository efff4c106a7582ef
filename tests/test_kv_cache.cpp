// The paged KV cache: the block allocator under random workloads (a property
// test: no leak, no double free, shared blocks never overwritten), the same
// with sliding-window layers whose window parts are given back, prefix
// reuse across conversations, LRU eviction, prefix-cache hits giving
// exactly the logits of a cold prefill, and a sequence decoded with
// window-sized storage for its local layers giving exactly the logits of one
// that keeps every position.
#include <QtTest>

#include <map>
#include <random>

#include "backend/cpu/host_kv_store.h"
#include "phaselab/backend.h"
#include "phaselab/kv_cache.h"
#include "phaselab/sampler.h"
#include "phaselab/session.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;

namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 1;
  c.n_head_kv = 1;
  c.head_dim = 2;
  return c;
}

// The K/V bytes of the pools of these tests, held as a CPU backend holds
// them; rows_of(kv) applies the pool's copies on write first, as a pass does.
HostKvStore& store() {
  static HostKvStore s;
  return s;
}
HostKv& bytes_of(KvPool& pool) {
  auto h = store().prepare(pool);
  if (!h) qFatal("%s", h.status().message().c_str());
  return **h;
}
SeqKv rows_of(const KvCache& kv) {
  bytes_of(const_cast<KvPool&>(kv.pool()));
  return store().of(kv);
}

// Plays a backend: writes K = 1000 * layer + token id and V = -K for the
// new positions of n_layer layers (so that a row read from another layer's
// storage shows).
float k_of(int il, int32_t token) { return 1000.f * il + static_cast<float>(token); }
Status write_tokens(KvCache& kv, const std::vector<int32_t>& toks, int n_layer = 2) {
  PHASELAB_TRY(kv.reserve(static_cast<int>(toks.size())));
  const int p0 = kv.n_past();
  const SeqKv rows = rows_of(kv);
  for (size_t i = 0; i < toks.size(); i++)
    for (int il = 0; il < n_layer; il++) {
      static_cast<float*>(rows.k(il, p0 + static_cast<int>(i)))[0] = k_of(il, toks[i]);
      static_cast<float*>(rows.v(il, p0 + static_cast<int>(i)))[0] = -k_of(il, toks[i]);
    }
  kv.append(toks.data(), static_cast<int>(toks.size()));
  return Status::ok();
}

void check_invariants(const KvPool& pool, const std::vector<std::unique_ptr<KvCache>>& seqs) {
  std::map<int, int> refs;
  for (const auto& s : seqs) {
    QVERIFY(static_cast<int>(s->block_table().size()) * KvPool::kBlockTokens >= s->n_past());
    for (int b : s->block_table()) refs[b]++;
    // Contents: every position holds what was written for its token.
    for (int p = 0; p < s->n_past(); p++)
      for (int il = 0; il < 2; il++) {
        QCOMPARE(static_cast<const float*>(rows_of(*s).k(il, p))[0], k_of(il, s->tokens()[p]));
        QCOMPARE(static_cast<const float*>(rows_of(*s).v(il, p))[0], -k_of(il, s->tokens()[p]));
      }
  }
  int free_blocks = 0, cached = 0;
  for (int b = 0; b < pool.n_blocks(); b++) {
    QCOMPARE(pool.refcount(b), refs.count(b) ? refs[b] : 0);
    if (pool.refcount(b) == 0) (pool.published(b) ? cached : free_blocks)++;
  }
  QCOMPARE(pool.n_free(), free_blocks);  // a double free would count twice
  QCOMPARE(pool.n_cached(), cached);
  QCOMPARE(pool.n_free() + pool.n_cached() + pool.n_used(), pool.n_blocks());
}

// Three layers, the first and last local with a window of 20 positions.
ModelConfig windowed_config() {
  ModelConfig c = small_config();
  c.n_layer = 3;
  c.sliding_window = 20;
  c.layer_is_swa = {1, 0, 1};
  return c;
}

void check_windowed_invariants(const KvPool& pool, const std::vector<std::unique_ptr<KvCache>>& seqs) {
  const int B = KvPool::kBlockTokens, W = pool.window();
  std::map<int, int> refs, wrefs;
  for (const auto& s : seqs) {
    const auto& table = s->block_table();
    for (size_t i = 0; i < table.size(); i++) {
      refs[table[i]]++;
      if (s->holds_window(static_cast<int>(i))) wrefs[table[i]]++;
    }
    // The blocks the next query sees in the local layers are held, with
    // what was written for their tokens; the global layer keeps everything.
    const int n = s->n_past();
    const int first = std::max(0, n - W + 1);
    for (int i = first / B; i * B < n; i++) QVERIFY2(s->holds_window(i), qPrintable(QString("block %1 of %2").arg(i).arg(n)));
    for (int p = 0; p < n; p++)
      for (int il = 0; il < 3; il++) {
        if (il != 1 && p < first) continue;
        QVERIFY(s->has_row(il, p));
        QCOMPARE(static_cast<const float*>(rows_of(*s).k(il, p))[0], k_of(il, s->tokens()[p]));
        QCOMPARE(static_cast<const float*>(rows_of(*s).v(il, p))[0], -k_of(il, s->tokens()[p]));
      }
  }
  int free_blocks = 0, cached = 0, with_part = 0, held_parts = 0;
  for (int b = 0; b < pool.n_blocks(); b++) {
    QCOMPARE(pool.refcount(b), refs.count(b) ? refs[b] : 0);
    QCOMPARE(pool.window_refcount(b), wrefs.count(b) ? wrefs[b] : 0);
    if (pool.window_refcount(b) > 0) held_parts++;
    if (pool.has_window_part(b)) with_part++;
    if (pool.refcount(b) == 0) {
      (pool.published(b) ? cached : free_blocks)++;
      if (!pool.published(b)) QVERIFY(!pool.has_window_part(b));  // a free block's part is free too
    }
  }
  QCOMPARE(pool.n_free(), free_blocks);
  QCOMPARE(pool.n_cached(), cached);
  QCOMPARE(pool.n_window_used(), held_parts);
  QVERIFY(with_part <= pool.n_window_blocks());  // no window part is handed out twice
}

// A new request on kv that starts like other's tokens (a random part of
// them, then up to 7 random tokens): reuse_prefix agrees with
// reusable_prefix and leaves kv holding that prefix of the prompt.
template <class RandomTokens>
void start_like(KvCache& kv, const std::vector<int32_t>& other, std::mt19937& rng, RandomTokens random_tokens) {
  std::vector<int32_t> prompt(other.begin(), other.begin() + static_cast<long>(rng() % (other.size() + 1)));
  const auto tail = random_tokens(static_cast<int>(rng() % 8));
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  if (prompt.empty()) return;
  const int predicted = kv.reusable_prefix(prompt.data(), static_cast<int>(prompt.size()));
  const int reused = kv.reuse_prefix(prompt.data(), static_cast<int>(prompt.size()));
  QCOMPARE(reused, predicted);
  QVERIFY(reused <= static_cast<int>(prompt.size()));
  QVERIFY(std::equal(prompt.begin(), prompt.begin() + reused, kv.tokens().begin()));
  QCOMPARE(kv.n_past(), reused);
}

std::shared_ptr<const Model> load_model(const std::string& path) {
  auto m = Model::load(path);
  if (!m) qFatal("load %s: %s", path.c_str(), m.status().message().c_str());
  return *m;
}

}  // namespace

class TestKvCache : public QObject {
  Q_OBJECT
 private slots:
  void allocator_never_leaks_or_double_frees_under_random_workloads() {
    auto pool = KvPool::create(small_config(), 24, KvType::f32);
    QVERIFY(pool.is_ok());
    std::mt19937 rng(7);
    std::vector<std::unique_ptr<KvCache>> seqs;
    for (int i = 0; i < 4; i++) seqs.push_back(KvCache::create_in(*pool, 96));
    // Few distinct tokens and shared beginnings, so that prefixes repeat.
    auto random_tokens = [&](int n) {
      std::vector<int32_t> t(n);
      for (auto& x : t) x = static_cast<int32_t>(rng() % 3);
      return t;
    };
    std::vector<std::vector<int32_t>> history(4);
    for (int step = 0; step < 3000; step++) {
      const int si = static_cast<int>(rng() % 4);
      KvCache& kv = *seqs[si];
      switch (rng() % 5) {
        case 0:
        case 1: {  // append
          const auto t = random_tokens(1 + static_cast<int>(rng() % 20));
          const Status st = write_tokens(kv, t);
          if (!st.is_ok()) {
            QVERIFY(st.code() == StatusCode::context_full || st.code() == StatusCode::out_of_memory);
            kv.truncate(kv.n_past());  // drop blocks reserved for the failed write
          }
          break;
        }
        case 2:  // rollback
          kv.truncate(static_cast<int>(rng() % (kv.n_past() + 1)));
          break;
        case 3:  // a new request that starts like another sequence
          start_like(kv, seqs[rng() % 4]->tokens(), rng, random_tokens);
          break;
        case 4:
          kv.clear();
          break;
      }
      check_invariants(**pool, seqs);
      if (QTest::currentTestFailed()) QFAIL(qPrintable(QString("after step %1").arg(step)));
    }
    seqs.clear();  // every block returns to the pool
    QCOMPARE((*pool)->n_used(), 0);
  }

  // The same workload on a pool whose local layers have window parts for
  // 10 of its 24 blocks: sequences give back what their next query cannot
  // see, rollbacks and prefix reuse take parts back while they are there
  // (or settle for a shorter prefix), and no part is ever read for the
  // wrong block.
  void window_parts_never_leak_or_mix_under_random_workloads() {
    auto pool = KvPool::create(windowed_config(), 24, KvType::f32, 10);
    QVERIFY(pool.is_ok());
    QVERIFY((*pool)->windowed());
    QCOMPARE((*pool)->n_window_blocks(), 10);
    // 24 blocks of the global layer and 10 of each local one.
    QCOMPARE(bytes_of(**pool).bytes(), uint64_t(2) * 4 * KvPool::kBlockTokens * 2 * (24 + 2 * 10));
    QCOMPARE(KvPool::bytes_for(windowed_config(), 24, KvType::f32, 10), bytes_of(**pool).bytes());
    std::mt19937 rng(11);
    std::vector<std::unique_ptr<KvCache>> seqs;
    for (int i = 0; i < 3; i++) seqs.push_back(KvCache::create_in(*pool, 200));
    auto random_tokens = [&](int n) {
      std::vector<int32_t> t(n);
      for (auto& x : t) x = static_cast<int32_t>(rng() % 3);
      return t;
    };
    int dropped = 0;
    for (int step = 0; step < 4000; step++) {
      const int si = static_cast<int>(rng() % 3);
      KvCache& kv = *seqs[si];
      switch (rng() % 6) {
        case 0:
        case 1:
        case 2: {  // append (most often, so that sequences outgrow the window)
          const auto t = random_tokens(1 + static_cast<int>(rng() % 12));
          const Status st = write_tokens(kv, t, 3);
          if (!st.is_ok()) {
            QVERIFY(st.code() == StatusCode::context_full || st.code() == StatusCode::out_of_memory);
            kv.truncate(kv.n_past());
          }
          if (kv.n_past() > 40 && !kv.holds_window(0)) dropped++;
          break;
        }
        case 3: {  // rollback
          const int want = static_cast<int>(rng() % (kv.n_past() + 1));
          const int got = kv.truncate(want);
          QVERIFY(got <= want);
          QCOMPARE(kv.n_past(), got);
          break;
        }
        case 4:  // a new request that starts like another sequence
          start_like(kv, seqs[rng() % 3]->tokens(), rng, random_tokens);
          break;
        case 5:
          if (rng() % 4 == 0) kv.clear();
          break;
      }
      check_windowed_invariants(**pool, seqs);
      if (QTest::currentTestFailed()) QFAIL(qPrintable(QString("after step %1").arg(step)));
    }
    QVERIFY2(dropped > 100, qPrintable(QString("window parts given back only %1 times").arg(dropped)));
    seqs.clear();
    QCOMPARE((*pool)->n_used(), 0);
    QCOMPARE((*pool)->n_window_used(), 0);
  }

  // A rollback within what the last pass computed keeps the window; a
  // rollback far back, after other blocks took the parts, stops at 0 and
  // says so, instead of reading K/V that is gone.
  void rollback_past_a_lost_window_recomputes() {
    auto pool = KvPool::create(windowed_config(), 16, KvType::f32, 3);
    QVERIFY(pool.is_ok());
    auto a = KvCache::create_in(*pool, 256);
    std::vector<int32_t> t(8);
    for (int i = 0; i < 12; i++) {  // 96 positions, 8 at a time: the window keeps 2 or 3 blocks
      for (int j = 0; j < 8; j++) t[j] = 8 * i + j;
      QVERIFY(write_tokens(*a, t, 3));
    }
    QCOMPARE(a->n_past(), 96);
    QVERIFY(!a->holds_window(0));
    QCOMPARE(a->truncate(90), 90);  // the last pass's own positions
    // Another sequence takes every window part there is.
    auto b = KvCache::create_in(*pool, 256);
    std::vector<int32_t> u(32, 7);
    QVERIFY(!write_tokens(*b, u, 3));  // 2 parts free, 3 needed: refused, not corrupted
    b->truncate(b->n_past());
    QVERIFY(write_tokens(*b, std::vector<int32_t>(16, 7), 3));
    QCOMPARE(a->truncate(40), 0);  // blocks 1 and 2's parts went to b
    QCOMPARE(a->n_past(), 0);
    std::vector<std::unique_ptr<KvCache>> both;
    both.push_back(std::move(a));
    both.push_back(std::move(b));
    check_windowed_invariants(**pool, both);
  }

  // Gemma 3's layout (local layers, window 20 here) decoded with window
  // parts for a pass's needs alone, against a cache that keeps every
  // position of every layer: bitwise the same logits at every step, in a
  // fraction of the memory, with rollbacks as speculative decoding makes.
  void window_sized_storage_gives_the_logits_of_full_storage_data() {
    QTest::addColumn<bool>("fast");
    QTest::newRow("fast") << true;
    QTest::newRow("reference") << false;
  }
  void window_sized_storage_gives_the_logits_of_full_storage() {
    QFETCH(bool, fast);
    TinySpec spec = tiny_spec("gemma3");
    spec.sliding_window = 20;
    spec.n_layer = 4;  // local, global, local, global
    auto m = load_model(write_tiny_model(spec, "tiny_kv_window.gguf"));
    const ModelConfig& c = m->config();
    const int V = c.n_vocab, n_ctx = 240, chunk = 8;
    auto be = fast ? make_cpu_backend(m, 2, chunk) : make_cpu_reference_backend(m, 2, chunk);
    QVERIFY(be.is_ok());
    auto small = KvCache::create(c, n_ctx, KvType::f16, chunk);
    auto full = KvCache::create(c, n_ctx, KvType::f16, n_ctx);
    QVERIFY(small.is_ok() && full.is_ok());
    QVERIFY((*small)->pool().windowed());
    QCOMPARE((*full)->pool().n_window_blocks(), (*full)->pool().n_blocks());
    QVERIFY((*small)->pool().n_window_blocks() <= (*full)->pool().n_blocks() / 2);
    QVERIFY((*be)->kv_bytes((*small)->pool()) <= (*be)->kv_bytes((*full)->pool()) * 3 / 4);
    QCOMPARE(KvCache::bytes_for(c, n_ctx, KvType::f16, chunk), (*be)->kv_bytes((*small)->pool()));
    std::vector<int32_t> prompt;
    for (int i = 0; i < 50; i++) prompt.push_back(3 + (i * 29) % (V - 3));
    std::vector<float> ls(static_cast<size_t>(chunk) * V), lf(static_cast<size_t>(chunk) * V);
    for (size_t i = 0; i < prompt.size(); i += chunk) {
      const int n = std::min<int>(chunk, static_cast<int>(prompt.size() - i));
      QVERIFY((*be)->forward(prompt.data() + i, n, **small, ls.data(), LogitsMode::last));
      QVERIFY((*be)->forward(prompt.data() + i, n, **full, lf.data(), LogitsMode::last));
    }
    QVERIFY(std::equal(ls.begin(), ls.begin() + V, lf.begin()));
    std::mt19937 rng(3);
    for (int step = 0; (*small)->n_past() + chunk < n_ctx; step++) {
      // Every third step verifies a "draft" of up to 5 tokens and keeps a
      // random part of it, as speculative decoding does.
      const int n = step % 3 == 2 ? 1 + static_cast<int>(rng() % 5) : 1;
      std::vector<int32_t> toks{argmax(ls.data(), V)};
      for (int j = 1; j < n; j++) toks.push_back(static_cast<int32_t>(3 + rng() % (V - 3)));
      QVERIFY((*be)->forward(toks.data(), n, **small, ls.data(), LogitsMode::all));
      QVERIFY((*be)->forward(toks.data(), n, **full, lf.data(), LogitsMode::all));
      QVERIFY2(std::equal(ls.begin(), ls.begin() + static_cast<long>(n) * V, lf.begin()),
               qPrintable(QString("step %1 at position %2").arg(step).arg((*small)->n_past())));
      if (n > 1) {  // keep the first r + 1: row r predicts the next token
        const int p = (*small)->n_past() - n, r = static_cast<int>(rng() % n);
        QCOMPARE((*small)->truncate(p + 1 + r), p + 1 + r);
        QCOMPARE((*full)->truncate(p + 1 + r), p + 1 + r);
        std::copy_n(ls.begin() + static_cast<long>(r) * V, V, ls.begin());
      }
      QVERIFY((*small)->pool().n_window_used() <= (*small)->pool().n_window_blocks());
    }
    QVERIFY((*small)->n_past() > 200);
    QVERIFY(!(*small)->holds_window(0));  // long given back
  }

  // A chat's next turn after an answer much longer than the window: the new
  // prompt repeats the old one and then differs from the sampled answer, so
  // the cache goes back to the old prompt's end. Its window was pinned there
  // (Session pins at each prompt's end), so the old prompt is reused, not
  // recomputed, and the answer is the one a cold prefill gives.
  void next_turn_after_a_long_answer_reuses_the_prompt() {
    TinySpec spec = tiny_spec("gemma3");
    spec.sliding_window = 20;
    auto m = load_model(write_tiny_model(spec, "tiny_kv_turns.gguf"));
    const int V = m->config().n_vocab;
    auto open = [&] { return std::move(*Session::create(m, std::move(*make_cpu_backend(m, 2, 8)), 256)); };
    auto s = open();
    QVERIFY(s->kv().pool().n_window_blocks() <= s->kv().pool().n_blocks() / 2);
    std::vector<int32_t> prompt;
    for (int i = 0; i < 30; i++) prompt.push_back(3 + (i * 31) % (V - 3));
    GenerateOptions opt = greedy(120);
    auto first = s->generate(prompt, opt);
    QVERIFY(first.is_ok());
    QCOMPARE(static_cast<int>(first->tokens.size()), 120);
    QVERIFY(!s->kv().holds_window(0));  // the answer moved the window on
    std::vector<int32_t> turn2 = prompt;
    for (int i = 0; i < 12; i++) turn2.push_back(first->tokens[0] == 5 + i ? 6 + i : 5 + i);  // not the answer
    auto warm = s->generate(turn2, greedy(16));
    QVERIFY(warm.is_ok());
    QCOMPARE(warm->metrics.n_reused, static_cast<int>(prompt.size()));
    GenerateOptions cold_opt = greedy(16);
    cold_opt.prefix_cache = false;
    auto cold = open()->generate(turn2, cold_opt);
    QVERIFY(cold.is_ok());
    QCOMPARE(warm->tokens, cold->tokens);
    // A one-shot session (chat = false) has no room for the pinned window:
    // a smaller pool, and the same next turn finds the prompt's window gone
    // (it recomputes, and answers the same).
    auto one = std::move(*Session::create(m, std::move(*make_cpu_backend(m, 2, 8)), 256, KvType::f16, false));
    QVERIFY(one->kv_bytes() < s->kv_bytes());
    QCOMPARE(one->kv().pool().n_window_blocks() + (spec.sliding_window - 1) / KvPool::kBlockTokens + 2,
             s->kv().pool().n_window_blocks());
    QVERIFY(one->generate(prompt, opt).is_ok());
    auto again = one->generate(turn2, greedy(16));
    QVERIFY(again.is_ok());
    QVERIFY2(again->metrics.n_reused < static_cast<int>(prompt.size()),
             qPrintable(QString("reused %1").arg(again->metrics.n_reused)));
    QCOMPARE(again->tokens, cold->tokens);
  }

  void two_conversations_share_the_system_prompt_blocks() {
    auto pool = KvPool::create(small_config(), 16, KvType::f32);
    QVERIFY(pool.is_ok());
    auto a = KvCache::create_in(*pool, 128);
    auto b = KvCache::create_in(*pool, 128);
    std::vector<int32_t> system(40);
    for (int i = 0; i < 40; i++) system[i] = 100 + i;
    QVERIFY(write_tokens(*a, system));
    std::vector<int32_t> prompt_b = system;
    prompt_b.insert(prompt_b.end(), {7, 8, 9});
    QCOMPARE(b->reuse_prefix(prompt_b.data(), static_cast<int>(prompt_b.size())), 32);  // two full blocks
    QCOMPARE(b->block_table()[0], a->block_table()[0]);
    QCOMPARE(b->block_table()[1], a->block_table()[1]);
    QCOMPARE((*pool)->n_shared(), 2);
    // b continues: its own block 2; a's blocks are untouched.
    QVERIFY(write_tokens(*b, std::vector<int32_t>(prompt_b.begin() + 32, prompt_b.end())));
    QVERIFY(b->block_table()[2] != a->block_table()[2]);
    std::vector<std::unique_ptr<KvCache>> both;
    both.push_back(std::move(a));
    both.push_back(std::move(b));
    check_invariants(**pool, both);
  }

  void rolled_back_shared_block_is_copied_before_writing() {
    auto pool = KvPool::create(small_config(), 8, KvType::f32);
    QVERIFY(pool.is_ok());
    auto a = KvCache::create_in(*pool, 64);
    std::vector<int32_t> t(16, 5);
    QVERIFY(write_tokens(*a, t));  // one full, published block
    const int first = a->block_table()[0];
    a->truncate(10);                              // rollback inside it
    QVERIFY(write_tokens(*a, {1, 2, 3, 4, 5, 6}));  // must not change the published block
    QVERIFY(a->block_table()[0] != first);
    QCOMPARE(static_cast<const float*>(bytes_of(**pool).k(first, 0, 12))[0], k_of(0, 5));
    QCOMPARE(static_cast<const float*>(rows_of(*a).k(0, 12))[0], k_of(0, 3));
  }

  // The copy on write a reservation makes is kept when the reservation then
  // fails and the sequence gives back what it took (the engine loop does
  // that while it plans): the copy holds the rows before the rollback point.
  void copy_on_write_survives_a_failed_reservation() {
    auto pool = KvPool::create(small_config(), 3, KvType::f32);
    QVERIFY(pool.is_ok());
    auto a = KvCache::create_in(*pool, 64);
    QVERIFY(write_tokens(*a, std::vector<int32_t>(16, 5)));  // one full, published block
    const int first = a->block_table()[0];
    a->truncate(10);
    QVERIFY(!a->reserve(40));  // copies the block, then runs out of blocks
    QCOMPARE(a->truncate(a->n_past()), 10);
    QVERIFY(a->block_table()[0] != first);
    QVERIFY(write_tokens(*a, {1, 2}));
    std::vector<std::unique_ptr<KvCache>> seqs;
    seqs.push_back(std::move(a));
    check_invariants(**pool, seqs);
  }

  void unreferenced_blocks_are_evicted_least_recently_used_first() {
    auto pool = KvPool::create(small_config(), 3, KvType::f32);
    QVERIFY(pool.is_ok());
    auto kv = KvCache::create_in(*pool, 64);
    std::vector<int32_t> a(16, 1), b(16, 2);
    QVERIFY(write_tokens(*kv, a));
    kv->clear();  // a's block: cached
    QVERIFY(write_tokens(*kv, b));
    kv->clear();  // b's block: cached, more recent
    QCOMPARE((*pool)->n_cached(), 2);
    // Two new blocks: the free one first, then the oldest cached (a's).
    std::vector<int32_t> c(32, 3);
    QVERIFY(write_tokens(*kv, c));
    kv->clear();
    QCOMPARE(kv->reuse_prefix(b.data(), 16), 16);  // b survived
    kv->clear();
    QCOMPARE(kv->reuse_prefix(a.data(), 16), 0);  // a was evicted
  }

  // What mirrors of a pool (the CUDA backend's device pool) rely on: pools
  // have distinct ids, and a block's generation moves on each time it is
  // handed out, eviction included, and only then.
  void pools_and_block_lives_are_told_apart() {
    auto p1 = KvPool::create(small_config(), 2, KvType::f32), p2 = KvPool::create(small_config(), 2, KvType::f32);
    QVERIFY(p1.is_ok() && p2.is_ok());
    QVERIFY((*p1)->id() != (*p2)->id());
    auto kv = KvCache::create_in(*p1, 64);
    std::vector<int32_t> a(16, 1), b(16, 2), c(16, 3);
    QVERIFY(write_tokens(*kv, a));
    const int ba = kv->block_table()[0];
    const uint32_t g = (*p1)->generation(ba);
    QVERIFY(g > 0);
    kv->clear();  // cached, not handed out: the same life
    QCOMPARE(kv->reuse_prefix(a.data(), 16), 16);
    QCOMPARE((*p1)->generation(ba), g);
    kv->clear();
    QVERIFY(write_tokens(*kv, b));  // the free block
    kv->clear();
    QVERIFY(write_tokens(*kv, c));  // evicts a's block: a new life
    QCOMPARE(kv->block_table()[0], ba);
    QCOMPARE((*p1)->generation(ba), g + 1);
  }

  // A prefix-cache hit must give exactly the logits of a cold prefill, on a
  // real model, across a switch between two conversations.
  void prefix_cache_hit_equals_cold_prefill_data() {
    QTest::addColumn<bool>("fast");
    QTest::newRow("fast") << true;
    QTest::newRow("reference") << false;
  }
  void prefix_cache_hit_equals_cold_prefill() {
    QFETCH(bool, fast);
    auto m = Model::load(test_data("stories260K.gguf"));
    QVERIFY(m.is_ok());
    auto open = [&] {
      auto b = fast ? make_cpu_backend(*m, 2, 8) : make_cpu_reference_backend(*m, 2, 8);
      return std::move(*Session::create(*m, std::move(*b), 256));
    };
    auto s = open();
    const Tokenizer& tok = (*m)->tokenizer();
    const auto conv_a = tok.encode("Lily and Tom went to the park with their dog. They played with a red ball all day.", true, false);
    const auto conv_b = tok.encode("Once upon a time there was a big old tree in the forest near the river.", true, false);
    auto ra = s->generate(conv_a, greedy(20));
    QVERIFY(ra.is_ok());
    auto rb = s->generate(conv_b, greedy(20));  // switches the sequence to b
    QVERIFY(rb.is_ok());
    QCOMPARE(rb->metrics.n_reused, 1);  // only the BOS token is common
    // Back to a, one turn later: its blocks are found again by hash.
    std::vector<int32_t> turn2 = conv_a;
    turn2.insert(turn2.end(), ra->tokens.begin(), ra->tokens.end());
    const auto more = tok.encode(" Then they went home.", false, false);
    turn2.insert(turn2.end(), more.begin(), more.end());
    auto warm = s->generate(turn2, greedy(16));
    QVERIFY(warm.is_ok());
    QVERIFY2(warm->metrics.n_reused >= static_cast<int>(conv_a.size()) / 16 * 16,
             qPrintable(QString("reused %1").arg(warm->metrics.n_reused)));
    GenerateOptions cold_opt = greedy(16);
    cold_opt.prefix_cache = false;
    auto cold_session = open();
    auto cold = cold_session->generate(turn2, cold_opt);
    QVERIFY(cold.is_ok());
    QCOMPARE(cold->metrics.n_reused, 0);
    QCOMPARE(warm->tokens, cold->tokens);
    // And bit for bit on the logits.
    std::vector<float> lw, lc;
    s->kv().reuse_prefix(turn2.data(), static_cast<int>(turn2.size()) - 1);
    const int reused = s->kv().n_past();
    QVERIFY(reused > 0);
    QVERIFY(s->eval(std::vector<int32_t>(turn2.begin() + reused, turn2.end()), &lw));
    cold_session->kv().clear();
    QVERIFY(cold_session->eval(turn2, &lc));
    QVERIFY(lw == lc);
  }
};

QTEST_APPLESS_MAIN(TestKvCache)
#include "test_kv_cache.moc"
