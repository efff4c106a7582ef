// The server's counters and histograms, written in the Prometheus text
// exposition format (version 0.0.4) for GET /metrics.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "phaselab/scheduler.h"
#include "phaselab/session.h"

namespace phaselab {

// A cumulative histogram with fixed upper bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // # HELP, # TYPE, the _bucket lines (le="..." and "+Inf"), _sum and _count.
  void render(std::string* out, const std::string& name, const std::string& help) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative (render sums them)
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  // A request that ran: its metrics, and how it ended ("stop", "length",
  // "cancelled", "error").
  void record(const RequestMetrics& m, const std::string& outcome);
  // A request refused before it ran (a 4xx answer).
  void record_rejected();
  // Everything, with the scheduler's gauges (running, waiting, KV blocks).
  std::string render(const Scheduler::Stats& s) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, tpot_, e2e_;
  uint64_t prompt_tokens_ = 0, reused_tokens_ = 0, generated_tokens_ = 0;
  uint64_t n_stop_ = 0, n_length_ = 0, n_cancelled_ = 0, n_error_ = 0, n_rejected_ = 0;
  uint64_t spec_drafted_ = 0, spec_accepted_ = 0;
};

}  // namespace phaselab
