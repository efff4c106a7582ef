// phaselab-cli bench --batch 1,2,4,...: aggregate throughput against batch
// size (phaselab/batch_bench.h), with the roofline's ridge: the batch where
// decode stops being bandwidth-bound on this machine.

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_probes.h"
#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/batch_bench.h"
#include "phaselab/machine.h"
#include "phaselab/memory.h"

namespace phaselab::cli {


int bench_batch_sweep(const Args& args) {
  auto sizes = parse_batch_sizes(args.get_or("--batch", ""));
  if (!sizes) return report(sizes.status().with_context("--batch"));
  auto n_prompt = args.get_int("--n-prompt", 128, 1, 1 << 16);
  auto n_gen = args.get_int("--n-gen", 32, 1, 1 << 16);
  auto reps = args.get_int("--repetitions", 1, 1, 1000);
  for (const Status& st : {n_prompt.status(), n_gen.status(), reps.status()})
    if (!st.is_ok()) return report(st);
  const int max_b = sizes->back();  // sorted
  auto opened = open_model_and_backend(args, std::max(64, max_b));
  if (!opened) return report(opened.status());
  if (max_b > opened->backend->max_batch())
    return usage_error("batch " + std::to_string(max_b) + " needs --batch-size of at least " + std::to_string(max_b) +
                       " (one decode pass takes a token of every sequence)");
  const int threads = opened->threads;
  Backend& backend = *opened->backend;
  const std::string name = backend.name();
  if (!backend.batched_forward())
    std::fprintf(stderr, "phaselab-cli: the %s backend runs a batch's sequences one after another (no shared pass yet)\n",
                 name.c_str());
  auto kv_type = cache_type(args);
  if (!kv_type) return report(kv_type.status());
  // The machine probed before and after the sweep, with the placement of
  // the CPUs around it, as bench's (bench_probes.h).
  BenchProbes probes(name, args.has("--no-peaks"), threads);
  const Model& m = *opened->model;

  // A warm-up at the smallest size (page faults, thread start-up).
  if (auto w = bench_batch(backend, m, sizes->front(), std::min(*n_prompt, 16), 2); !w) return report(w.status());
  std::vector<BatchBenchPoint> points;
  for (int b : *sizes) {
    BatchBenchPoint sum;
    for (int r = 0; r < *reps; r++) {
      auto p = bench_batch(backend, m, b, *n_prompt, *n_gen, 42 + r, nullptr, *kv_type);
      if (!p) return report(p.status());
      sum.batch = b, sum.n_prompt = p->n_prompt, sum.n_gen = p->n_gen, sum.kv_mib = p->kv_mib;
      sum.prefill_ms += p->prefill_ms / *reps;
      sum.decode_ms += p->decode_ms / *reps;
    }
    sum.pp_tps = b * sum.n_prompt / (sum.prefill_ms / 1000.0);
    sum.tg_tps = b * sum.n_gen / (sum.decode_ms / 1000.0);
    sum.tpot_ms = sum.decode_ms / sum.n_gen;
    points.push_back(sum);
    std::fprintf(stderr, "phaselab-cli: batch %d: decode %.1f tok/s\n", b, sum.tg_tps);
  }
  probes.tests_done();
  const double rss = peak_rss_mib();
  probes.probe_again();  // (after the peak RSS: the probe resets it)
  const MachinePeaks& peaks = probes.peaks();
  const DecodeRoofline roof = decode_roofline(m, name, peaks.read_bandwidth, peaks.int8_ops, peaks.fp32_flops);
  const double weight_bytes = roof.weight_bytes;
  const double ridge = roof.ridge_batch;
  const double base_tg = points.front().batch == 1 ? points.front().tg_tps : 0;
  if (args.has("--json")) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& p : points)
      for (int phase = 0; phase < 2; phase++) {
        const bool tg = phase == 1;
        nlohmann::json j = {{"test", (tg ? "tg" : "pp") + std::to_string(tg ? p.n_gen : p.n_prompt)},
                            {"batch", p.batch},
                            {"n_prompt", p.n_prompt},
                            {"n_gen", p.n_gen},
                            {"tokens_per_s", tg ? p.tg_tps : p.pp_tps},
                            {"time_ms", tg ? p.decode_ms : p.prefill_ms},
                            {"repetitions", *reps},
                            {"backend", name},
                            {"batched_forward", backend.batched_forward()},
                            {"threads", threads},
                            {"model", m.path()},
                            {"type_mix", m.type_mix()},
                            {"kv_cache_mib", p.kv_mib},
                            {"kv_type", kv_type_name(*kv_type)},
                            {"machine_read_gbps", peaks.read_bandwidth / 1e9},
                            {"machine_int8_gops", peaks.int8_ops / 1e9},
                            {"machine_fp32_gflops", peaks.fp32_flops / 1e9},
                            {"decode_ridge_batch", ridge},
                            {"decode_ops_per_token", roof.ops_per_token},
                            {"peak_rss_mib", rss}};
        probes.add_json(j);
        if (tg) {
          j["tpot_ms"] = p.tpot_ms;
          j["decode_gbps"] = roof.weights_gbps(p.tpot_ms);
          if (base_tg > 0) j["speedup_vs_batch_1"] = p.tg_tps / base_tg;
        }
        arr.push_back(j);
      }
    std::printf("%s\n", arr.dump(2).c_str());
    return kExitOk;
  }
  std::printf("| model | backend | threads | batch | pp%d t/s | tg%d t/s | TPOT ms | weights GB/s | vs batch 1 |\n", *n_prompt,
              *n_gen);
  std::printf("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const std::string model_name = m.config().name.empty() ? m.config().arch_str : m.config().name;
  for (const auto& p : points)
    std::printf("| %s | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %s |\n", model_name.c_str(), name.c_str(), threads,
                p.batch, p.pp_tps, p.tg_tps, p.tpot_ms, roof.weights_gbps(p.tpot_ms),
                base_tg > 0 ? (std::to_string(p.tg_tps / base_tg).substr(0, 4) + "x").c_str() : "");
  if (peaks.read_bandwidth > 0)
    std::printf("\nmachine: read %.1f GB/s, %s %.0f %s; weights %.1f MiB read once per pass, %.2f G%s per decoded token "
                "(output matrix included): decode turns compute-bound near batch %.1f, where its ceiling is %.0f "
                "tokens/s\n",
                peaks.read_bandwidth / 1e9, roof.peak().name(), roof.ops_per_s / 1e9, roof.peak().unit(),
                weight_bytes / 1048576.0, roof.ops_per_token / 1e9, roof.peak().op(), ridge, roof.compute_ceiling_tps());
  probes.print_probe_line("the machine line and the ridge above");
  probes.print_placement_lines();
  std::printf("\npeak RSS %.1f MiB\n", rss);
  return kExitOk;
}

}  // namespace phaselab::cli
