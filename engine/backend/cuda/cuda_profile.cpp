#include "cuda_profile.h"

#include <algorithm>
#include <cstdio>

namespace phaselab {

// After the stream has synchronised: adds this pass's steps to the totals
// of its phase ("prefill": a pass with a prompt chunk; "decode": one token
// per sequence), T rows.
// A phase's first pass is left out: it loads the kernels it is the first
// to use (CUDA's lazy loading, cuBLAS's set-up), tens of milliseconds that
// are no step's cost (a Q/K/V step of 1.7 ms per layer where the whole
// 512-token pass takes 5.7 ms, on an H200).
void StepProfile::collect(const char* phase, int T) {
  if (!on_) return;
  if (warmed_[phase]++ == 0) {
    used_ = 0;
    return;
  }
  for (int i = 1; i < used_; i++) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, events_[i - 1], events_[i]) != cudaSuccess) continue;
    Total& t = totals_[phase][names_[i]];
    t.ms += ms;
    t.calls++;
  }
  passes_[phase]++;
  tokens_[phase] += T;
  used_ = 0;
}

void StepProfile::print() const {
  for (const auto& [phase, steps] : totals_) {
    double sum = 0;
    for (const auto& [name, t] : steps) sum += t.ms;
    std::vector<std::pair<std::string, Total>> rows(steps.begin(), steps.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    std::fprintf(stderr, "\nCUDA profile, %s: %ld passes, %ld tokens, %.3f ms per pass (the first pass left out)\n",
                 phase.c_str(), passes_.at(phase), tokens_.at(phase), sum / std::max(1L, passes_.at(phase)));
    std::fprintf(stderr, "| step | ms per pass | share | us per launch group |\n| --- | ---: | ---: | ---: |\n");
    for (const auto& [name, t] : rows)
      std::fprintf(stderr, "| %s | %.4f | %.1f%% | %.2f |\n", name.c_str(), t.ms / std::max(1L, passes_.at(phase)),
                   100.0 * t.ms / std::max(sum, 1e-12), 1e3 * t.ms / std::max(1L, t.calls));
  }
}

}  // namespace phaselab
