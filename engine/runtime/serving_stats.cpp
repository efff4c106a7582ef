// The serving benchmark's figures (pure functions of the request traces),
// the run plan, and the JSON and table they are reported in.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>

#include "phaselab/serving_bench.h"
#include "phaselab/stats.h"

namespace phaselab {

LatencySummary summarize(std::vector<double> values) {
  LatencySummary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.n = values.size();
  s.p50 = percentile(values, 0.50);
  s.p90 = percentile(values, 0.90);
  s.p99 = percentile(values, 0.99);
  s.max = values.back();
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  return s;
}

std::vector<double> token_gaps(const RequestTrace& r) {
  std::vector<double> gaps;
  for (size_t i = 1; i < r.token_ms.size(); i++) gaps.push_back(r.token_ms[i] - r.token_ms[i - 1]);
  return gaps;
}

std::vector<double> chat_gaps(const std::vector<RequestTrace>& rs) {
  std::vector<double> out;
  for (const RequestTrace& r : rs)
    if (r.ok && r.kind == ServingKind::chat)
      for (double g : token_gaps(r)) out.push_back(g);
  return out;
}

std::vector<double> ttfts(const std::vector<RequestTrace>& rs) {
  std::vector<double> out;
  for (const RequestTrace& r : rs)
    if (r.ok && !r.token_ms.empty()) out.push_back(r.ttft_ms());
  return out;
}

std::vector<double> ttfts(const std::vector<RequestTrace>& rs, ServingKind kind) {
  std::vector<double> out;
  for (const RequestTrace& r : rs)
    if (r.ok && r.kind == kind && !r.token_ms.empty()) out.push_back(r.ttft_ms());
  return out;
}

std::vector<double> tpots(const std::vector<RequestTrace>& rs) {
  std::vector<double> out;
  for (const RequestTrace& r : rs)
    if (r.ok && r.token_ms.size() >= 2)
      out.push_back((r.token_ms.back() - r.token_ms.front()) / static_cast<double>(r.token_ms.size() - 1));
  return out;
}

bool meets_targets(const RequestTrace& r, const ServingTargets& t) {
  if (!r.ok || r.token_ms.empty() || r.ttft_ms() > t.ttft_ms) return false;
  for (double g : token_gaps(r))
    if (g > t.itl_ms) return false;
  return true;
}

Goodput goodput(const std::vector<RequestTrace>& rs, const ServingTargets& t, double duration_s) {
  Goodput g;
  for (const RequestTrace& r : rs) g.met += meets_targets(r, t) ? 1 : 0;
  g.per_s = duration_s > 0 ? g.met / duration_s : 0;
  g.fraction = rs.empty() ? 0 : static_cast<double>(g.met) / static_cast<double>(rs.size());
  return g;
}

std::vector<ServingRun> plan_serving_runs(const ServingWorkload& w, const std::vector<SchedulePolicy>& policies,
                                          int repeat) {
  std::vector<ServingRun> runs;
  if (policies.empty()) return runs;
  if (w.baseline && w.long_count > 0 && w.streams > 0) {
    ServingRun b{policies.front(), "baseline (no long prompt)", w};
    b.workload.long_count = 0;
    runs.push_back(b);
  }
  for (int r = 0; r < std::max(1, repeat); r++)
    for (const SchedulePolicy& p : policies) runs.push_back({p, p.name(), w});
  for (size_t i = 0; i < runs.size(); i++) runs[i].workload.prompt_set = static_cast<int>(i);
  return runs;
}

namespace {

using nlohmann::json;

json summary_json(const LatencySummary& s) {
  return {{"n", s.n}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}};
}

json row_json(const ServingRow& row, const ServingTargets& t) {
  int ok = 0;
  long long tokens = 0;
  json timeline = json::array();
  for (const RequestTrace& r : row.requests) {
    ok += r.ok ? 1 : 0;
    tokens += r.tokens;
    json e = {{"stream", r.stream},   {"kind", to_string(r.kind)}, {"arrive_ms", r.arrive_ms},
              {"n_prompt", r.n_prompt}, {"first_token_ms", r.token_ms.empty() ? 0.0 : r.token_ms.front()},
              {"token_ms", r.token_ms}, {"ok", r.ok}};
    if (!r.error.empty()) e["error"] = r.error;
    timeline.push_back(std::move(e));
  }
  const std::vector<double> gaps = chat_gaps(row.requests);
  const Goodput g = goodput(row.requests, t, row.duration_s);
  return {{"policy", row.policy},
          {"label", row.label},
          {"target", row.target},
          {"placement", row.placement},
          {"requests", row.requests.size()},
          {"ok", ok},
          {"duration_s", row.duration_s},
          {"tokens", tokens},
          {"tokens_per_s", row.duration_s > 0 ? tokens / row.duration_s : 0.0},
          {"ttft_ms", summary_json(summarize(ttfts(row.requests)))},
          {"ttft_long_ms", summary_json(summarize(ttfts(row.requests, ServingKind::long_doc)))},
          {"itl_ms", summary_json(summarize(gaps))},
          {"tpot_ms", summary_json(summarize(tpots(row.requests)))},
          {"max_stall_ms", gaps.empty() ? 0.0 : *std::max_element(gaps.begin(), gaps.end())},
          {"goodput_rps", g.per_s},
          {"goodput_fraction", g.fraction},
          {"kv_transfers", row.kv_transfer.transfers},
          {"kv_transfer_bytes", row.kv_transfer.bytes},
          {"kv_transfer_ms", row.kv_transfer.ms},
          {"timeline", std::move(timeline)}};
}

}  // namespace

std::string serving_report_json(const ServingReport& r, int indent) {
  const ServingWorkload& w = r.workload;
  json rows = json::array();
  for (const ServingRow& row : r.rows) rows.push_back(row_json(row, r.targets));
  const json j = {{"model", r.model},
                  {"backend", r.backend},
                  {"threads", r.threads},
                  {"workload",
                   {{"streams", w.streams},
                    {"chat_prompt", w.chat_prompt},
                    {"chat_answer", w.chat_answer},
                    {"long_prompt", w.long_prompt},
                    {"long_answer", w.long_answer},
                    {"long_count", w.long_count},
                    {"long_rate", w.long_rate},
                    {"long_start_s", w.long_start_s},
                    {"duration_s", w.duration_s},
                    {"seed", w.seed},
                    {"baseline", w.baseline}}},
                  {"targets", {{"ttft_ms", r.targets.ttft_ms}, {"itl_ms", r.targets.itl_ms}}},
                  {"rows", std::move(rows)}};
  // Prompts from a file may hold invalid UTF-8: replaced, never a throw.
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string serving_progress_json(const ServingProgress& p) {
  const json j = {{"progress",
                   {{"run", p.run}, {"of", p.of}, {"label", p.label}, {"elapsed_s", p.elapsed_s},
                    {"requests_done", p.requests_done}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string serving_table_header() {
  return "| run | requests ok | TTFT long p50 / p99 ms | ITL p50 / p99 ms | max stall ms | tok/s | goodput | KV moved |\n"
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
}

std::string serving_table_line(const ServingRow& row, const ServingTargets& t) {
  int ok = 0;
  long long tokens = 0;
  for (const RequestTrace& r : row.requests) ok += r.ok, tokens += r.tokens;
  const std::vector<double> gaps = chat_gaps(row.requests);
  const LatencySummary itl = summarize(gaps), ttft_long = summarize(ttfts(row.requests, ServingKind::long_doc));
  const Goodput g = goodput(row.requests, t, row.duration_s);
  char kv[64] = "-";
  if (row.kv_transfer.transfers > 0)
    std::snprintf(kv, sizeof kv, "%llu x, %.1f MiB, %.1f ms", static_cast<unsigned long long>(row.kv_transfer.transfers),
                  row.kv_transfer.bytes / 1048576.0, row.kv_transfer.ms);
  char ttft[64] = "-";
  if (ttft_long.n > 0) std::snprintf(ttft, sizeof ttft, "%.0f / %.0f", ttft_long.p50, ttft_long.p99);
  char line[512];
  std::snprintf(line, sizeof line, "| %s | %d / %zu | %s | %.1f / %.1f | %.1f | %.1f | %.2f/s (%.0f%%) | %s |\n",
                row.label.c_str(), ok, row.requests.size(), ttft, itl.p50, itl.p99, itl.max,
                row.duration_s > 0 ? tokens / row.duration_s : 0.0, g.per_s, 100 * g.fraction, kv);
  return line;
}

}  // namespace phaselab
