// Model and quantization comparison: several variants (model files, and
// quantizations made from the first one) through the same measurements, so
// that speed, memory and quality sit side by side.
//
// Per variant, in order, each from a fresh session:
//   pp512     prefill tokens/s of opts.n_prompt tokens from an empty cache
//             (one warm-up, then the mean and sample standard deviation of
//             opts.repetitions runs, as bench -r);
//   tg128     decode tokens/s of opts.n_gen tokens after a 16-token prompt,
//             greedy, with the variant's KV cache and speculative settings
//             (mean and sd of the runs);
//   ttft_ms   time to first token of a fixed chat prompt rendered with the
//             model's template, prefix cache off (mean and sd of the runs);
//   ppl       perplexity on the text (phaselab/perplexity.h, llama-perplexity's
//             conventions), opts.n_ctx tokens per chunk, opts.n_chunks chunks;
//   kld, kld_p99, top1_agree, rms_dp
//             against the first variant (the reference: kld 0, top1_agree 1);
//   accept_sampled
//             as a speculative draft of the first variant, teacher-forced on
//             the text: the sampled acceptance rate sum min(p, q) (a lower
//             bound, perplexity.h), beside top1_agree, the greedy one;
//   peak_rss_mib
//             the process's peak resident memory while the variant loaded and
//             ran: the kernel's high-water mark is reset before each variant
//             (/proc/self/clear_refs), so each row is its own; it counts
//             everything else the process holds, which is why the desktop
//             window runs `phaselab-cli compare` in a child process.
// A variant marked draft is then measured as the first variant's draft (the
// distillation question: how well does a smaller, pruned or quantized model
// stand in for the target?): the target answers the TTFT test's chat prompt
// (opts.n_gen tokens, greedy, in its template), plainly and with this
// variant drafting opts.draft_k tokens per pass (its own model and KV cache,
// make_draft_model_source), each the mean of the runs, one after the other
// in the same step: draft_tg, draft_base_tg, their ratio
// draft_speedup, and the acceptance and tokens per target pass measured while
// decoding. The output equals plain greedy decoding's (speculative.h).
//
// A --quant variant is written by quantize_model() into opts.cache_dir as
// <stem>-<TYPE>.gguf and reused while it is newer than its source; a pruned
// one by prune_layers() as <stem>[-<TYPE>]-pruned-A-B.gguf (prune_ffn():
// -pruned-ffnP.gguf), likewise.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "phaselab/quantize.h"
#include "phaselab/speculative.h"
#include "phaselab/status.h"

namespace phaselab {

struct CompareVariant {
  std::string name;                     // empty: the file name (and type)
  std::string file;                     // a GGUF model
  std::optional<FileType> quantize_to;  // made from file first (cached)
  std::string backend = "cpu";          // cpu | cpu-portable | cpu-reference | cuda
  bool kv_cache = true;
  // none | lookup | self (for tg): a SpeculativeMode's to_string; self skips
  // default_self_skip's layer on the CPU backends.
  std::string speculative = to_string(SpeculativeMode::off);
  // "" or a layer drop (prune.h: "layers:A-B", or "layers:nN" chosen on the
  // evaluation text) or an FFN width cut ("ffn:P%", neurons chosen on the
  // evaluation text), made from the (quantized) file into the cache.
  std::string prune;
  // Also measured as a speculative draft for the first variant (not the
  // first itself; it must share the first's vocabulary).
  bool draft = false;
};

struct CompareOptions {
  std::string text;        // the evaluation text (perplexity and KL)
  int n_ctx = 512;         // perplexity chunk
  int n_chunks = 8;        // -1: all the text holds
  int n_prompt = 512;      // pp test
  int n_gen = 128;         // tg test
  int repetitions = 3;
  int n_threads = 0;       // 0: one per physical core
  std::string cache_dir;   // quantized variants; empty: <user cache>/PhaseLab/quantized
  std::string ttft_prompt = "Why is the sky blue?";
  int draft_k = 4;         // tokens drafted per target pass in the draft test
};

struct CompareRow {
  std::string name, file, type_mix, backend;
  std::string file_type;   // "Q4_K_M", from general.file_type ("" when absent)
  double size_mib = 0;
  double pp = 0, tg = 0;   // tokens/s (pp512, tg128 with the default sizes): the mean of the runs
  double pp_sd = 0, tg_sd = 0;  // their sample standard deviation (0 for one run)
  double ttft_ms = 0, ttft_sd_ms = 0;  // mean and sample standard deviation
  int ttft_prompt_tokens = 0;          // the TTFT prompt's length in this model's template and tokens
  int n_prompt = 0, n_gen = 0;  // the pp and tg lengths measured
  int repetitions = 0;          // timed runs behind each mean; 0: unknown (a row saved before the spread was kept)
  double peak_rss_mib = 0;
  bool rss_per_variant = true;  // false: the kernel could not reset the peak (a lower bound of earlier rows')
  double ppl = 0, ppl_err = 0;
  double kld = 0, kld_p99 = 0, top1_agree = 1, rms_dp = 0;
  bool reference = false;
  bool kv_cache = true;
  std::string speculative;
  std::string prune;  // "layers:A-B" dropped ("" none)
  // Teacher-forced sampled acceptance as the first variant's draft (1 for
  // the reference; -1: unknown, a row saved before it was measured).
  double accept_sampled = -1;
  // tg's own speculation (lookup, self): acceptance and tokens per target pass (0: none).
  double spec_acceptance = 0, tokens_per_pass = 0;
  // The draft test (CompareVariant::draft): the reference model decoding
  // with this variant as its draft, and plainly, in the same step.
  bool draft = false;
  int draft_k = 0;
  double draft_tg = 0, draft_tg_sd = 0, draft_base_tg = 0, draft_base_tg_sd = 0;
  double draft_speedup = 0;                            // draft_tg / draft_base_tg
  double draft_acceptance = 0, draft_tokens_per_pass = 0;  // measured while decoding
};

struct CompareProgress {
  int variant = 0, n_variants = 0;  // the variant being measured (0-based)
  std::string stage;                // quantize | load | pp | tg | ttft | perplexity | draft | done
  double fraction = 0;              // of the whole run, 0..1
  std::string message;              // "Q5_K_M: perplexity chunk 3 of 8"
  const CompareRow* row = nullptr;  // stage "done": the variant's finished row (valid during the call)
};
using CompareProgressFn = std::function<void(const CompareProgress&)>;

// Where quantized variants are kept: $XDG_CACHE_HOME/PhaseLab/quantized, or
// ~/.cache/PhaseLab/quantized.
std::string default_compare_cache_dir();

// Checks the variants and options before anything runs (files exist, types
// and backends known, sizes in range); invalid_argument naming what is wrong.
Status validate_compare(const std::vector<CompareVariant>& variants, const CompareOptions& opts);

// Runs every variant (cancel is read between steps and inside perplexity).
// A variant that fails stops the run with its error, naming the variant.
Result<std::vector<CompareRow>> run_compare(const std::vector<CompareVariant>& variants, const CompareOptions& opts,
                                            const CompareProgressFn& progress = {},
                                            const std::atomic<bool>* cancel = nullptr);

// The rows as a JSON array / a Markdown-style table (what the CLI prints;
// speeds as "mean ± sd") / CSV (what the GUI exports). JSON field names:
// pp512, tg128 and ttft_ms hold the means whatever the lengths (n_prompt,
// n_gen), pp512_sd, tg128_sd and ttft_ms_sd their spread, repetitions the
// runs behind them; the rest as in CompareRow.
std::string compare_rows_json(const std::vector<CompareRow>& rows);
std::string compare_row_json(const CompareRow& row);  // one row on one line
std::string compare_rows_table(const std::vector<CompareRow>& rows, int n_prompt = 512, int n_gen = 128);
std::string compare_rows_csv(const std::vector<CompareRow>& rows);

// Back from compare_rows_json / compare_row_json text (a child process's
// output, a saved run, an exported file). name and tg128 are required; a
// field missing elsewhere keeps CompareRow's default (repetitions 0: no
// spread known). invalid_argument naming what is wrong.
Result<std::vector<CompareRow>> compare_rows_from_json(std::string_view json);
Result<CompareRow> compare_row_from_json(std::string_view json);

// One progress report as one JSON line, {"progress": {...}}, and a finished
// row as {"row": {...}}: what `phaselab-cli compare --progress-json` writes
// to stderr, so that a parent process follows the run and fills its table.
std::string compare_progress_json(const CompareProgress& p);

// The variants as a JSON array of {file, quantize_to ("" or a type name),
// backend, kv_cache, speculative, prune, draft, name} (what `compare --variants-json`
// reads and the desktop window saves with a run) and back; the parser
// names the variant and field that is wrong.
std::string compare_variants_json(const std::vector<CompareVariant>& variants);
Result<std::vector<CompareVariant>> compare_variants_from_json(std::string_view json);

}  // namespace phaselab
