#include "phaselab/server_metrics.h"

#include <cstdio>

namespace phaselab {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) i++;
  counts_[i]++;
  sum_ += v;
  count_++;
}

namespace {
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
void header(std::string* out, const std::string& name, const std::string& help, const char* type) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}
void scalar(std::string* out, const std::string& name, const std::string& help, const char* type, double v) {
  header(out, name, help, type);
  *out += name + " " + num(v) + "\n";
}
}  // namespace

void Histogram::render(std::string* out, const std::string& name, const std::string& help) const {
  header(out, name, help, "histogram");
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); i++) {
    cum += counts_[i];
    *out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  *out += name + "_sum " + num(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2}),
      e2e_({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}) {}

void ServerMetrics::record(const RequestMetrics& m, const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m.n_generated > 0) ttft_.observe(m.ttft_ms / 1000.0);
  if (m.n_generated > 1) tpot_.observe(m.tpot_ms / 1000.0);
  if (m.n_generated > 0) e2e_.observe((m.ttft_ms + m.decode_ms) / 1000.0);
  prompt_tokens_ += static_cast<uint64_t>(m.n_prompt);
  reused_tokens_ += static_cast<uint64_t>(m.n_reused);
  generated_tokens_ += static_cast<uint64_t>(m.n_generated);
  spec_drafted_ += static_cast<uint64_t>(m.spec_drafted);
  spec_accepted_ += static_cast<uint64_t>(m.spec_accepted);
  if (outcome == "stop") n_stop_++;
  else if (outcome == "length") n_length_++;
  else if (outcome == "cancelled") n_cancelled_++;
  else n_error_++;
}

void ServerMetrics::record_rejected() {
  std::lock_guard<std::mutex> lock(mu_);
  n_rejected_++;
}

std::string ServerMetrics::render(const Scheduler::Stats& s) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  ttft_.render(&o, "phaselab_time_to_first_token_seconds", "Time from a request's arrival to its first token.");
  tpot_.render(&o, "phaselab_time_per_output_token_seconds", "Mean time between a request's tokens after the first.");
  e2e_.render(&o, "phaselab_request_duration_seconds", "Time from a request's arrival to its last token.");
  scalar(&o, "phaselab_prompt_tokens_total", "Prompt tokens of finished requests.", "counter", double(prompt_tokens_));
  scalar(&o, "phaselab_prompt_tokens_reused_total", "Prompt tokens taken from the prefix cache instead of computed.",
         "counter", double(reused_tokens_));
  scalar(&o, "phaselab_generation_tokens_total", "Tokens generated.", "counter", double(generated_tokens_));
  header(&o, "phaselab_requests_total", "Requests by how they ended.", "counter");
  o += "phaselab_requests_total{finish=\"stop\"} " + std::to_string(n_stop_) + "\n";
  o += "phaselab_requests_total{finish=\"length\"} " + std::to_string(n_length_) + "\n";
  o += "phaselab_requests_total{finish=\"cancelled\"} " + std::to_string(n_cancelled_) + "\n";
  o += "phaselab_requests_total{finish=\"error\"} " + std::to_string(n_error_) + "\n";
  o += "phaselab_requests_total{finish=\"rejected\"} " + std::to_string(n_rejected_) + "\n";
  scalar(&o, "phaselab_requests_running", "Sequences in the running batch.", "gauge", s.running);
  scalar(&o, "phaselab_requests_waiting", "Requests queued for admission (preempted ones included).", "gauge", s.waiting);
  scalar(&o, "phaselab_kv_blocks_used", "KV pool blocks held by running sequences.", "gauge", s.kv_blocks_used);
  scalar(&o, "phaselab_kv_blocks_cached", "KV pool blocks kept for prefix reuse.", "gauge", s.kv_blocks_cached);
  scalar(&o, "phaselab_kv_blocks_total", "KV pool blocks in all.", "gauge", s.kv_blocks_total);
  scalar(&o, "phaselab_kv_usage_ratio", "Share of the KV pool's blocks held by running sequences.", "gauge",
         s.kv_blocks_total > 0 ? double(s.kv_blocks_used) / s.kv_blocks_total : 0.0);
  scalar(&o, "phaselab_forward_passes_total", "Forward passes the scheduler ran.", "counter", double(s.steps));
  scalar(&o, "phaselab_preemptions_total", "Sequences preempted (blocks freed, recomputed later).", "counter",
         double(s.preemptions));
  scalar(&o, "phaselab_batch_tokens", "Tokens in the latest forward pass.", "gauge", s.last_batch_tokens);
  scalar(&o, "phaselab_spec_draft_tokens_total", "Speculative decoding: tokens drafted.", "counter", double(spec_drafted_));
  scalar(&o, "phaselab_spec_accepted_tokens_total", "Speculative decoding: drafted tokens accepted.", "counter",
         double(spec_accepted_));
  scalar(&o, "phaselab_spec_acceptance_ratio", "Speculative decoding: accepted / drafted since the start (0 when none drafted).",
         "gauge", spec_drafted_ > 0 ? double(spec_accepted_) / double(spec_drafted_) : 0.0);
  return o;
}

}  // namespace phaselab
