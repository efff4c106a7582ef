#include "bench_probes.h"

#include <cstdio>

#include "cli_util.h"

namespace phaselab::cli {

namespace {

std::string trip_text(double ns) {
  char b[32];
  if (ns > 0) std::snprintf(b, sizeof b, "%.0f ns", ns);
  return ns > 0 ? std::string(b) : std::string("(not measured)");
}

}  // namespace

BenchProbes::BenchProbes(const std::string& backend, bool skip, int n_threads)
    : backend_(backend), on_cores_(backend.rfind("cpu", 0) == 0 && n_threads > 1) {
  before_ = best_ = measure_bench_peaks(backend, skip);
  // Where the threads' cores are, and where the probe's were (the probe
  // uses every core).
  if (on_cores_ || before_.read_bandwidth > 0) trip_probe_ = core_round_trip_ns();
  if (on_cores_) trip_before_ = trip_probe_;
}

void BenchProbes::tests_done() {
  if (on_cores_) trip_after_ = core_round_trip_ns();
}

void BenchProbes::probe_again() {
  if (before_.read_bandwidth <= 0) return;  // not probed before: not now either
  after_ = measure_bench_peaks(backend_, false);
  trip_probe_after_ = core_round_trip_ns();
  merged_ = after_.read_bandwidth > 0 && core_placement(trip_probe_) == core_placement(trip_probe_after_);
  best_ = merged_ ? better_peaks(before_, after_) : before_;
}

bool BenchProbes::peaks_changed() const {
  return after_.read_bandwidth > 0 && before_.plausible && after_.plausible && peaks_differ(before_, after_, 0.1);
}

void BenchProbes::print_probe_line(const std::string& users) const {
  if (!peaks_changed()) return;
  std::printf("machine probes differ: before the tests read %.1f GB/s, int8 %.0f GOP/s, FP32 %.0f GFLOP/s; after "
              "%.1f GB/s, %.0f GOP/s, %.0f GFLOP/s (%s)\n",
              before_.read_bandwidth / 1e9, before_.int8_ops / 1e9, before_.fp32_flops / 1e9, after_.read_bandwidth / 1e9,
              after_.int8_ops / 1e9, after_.fp32_flops / 1e9,
              (merged_ ? users + " use the larger of each" : "the CPUs had moved: " + users + " use the first")
                  .c_str());
}

void BenchProbes::print_placement_lines() const {
  if (on_cores_)
    std::printf("threads: a cache line between the first two CPUs this process may use and back took %s before the "
                "tests, %s after (~35 ns: two hardware threads of one core; ~50-70 ns: cores that share a last-level "
                "cache; ~300 ns: cores apart, e.g. on two AMD CCDs)\n",
                trip_text(trip_before_).c_str(), trip_text(trip_after_).c_str());
  if (placement_changed(trip_before_, trip_after_))
    std::printf("placement changed during the tests: the figures above mix two machines; measure again\n");
  else if (core_placement(trip_before_) == CorePlacement::one_core &&
           core_placement(trip_after_) == CorePlacement::one_core)
    std::printf("placement: the two CPUs are hardware threads of one core (they share its execution units: compute "
                "about halves); measure again for two cores\n");
}

void BenchProbes::add_json(nlohmann::json& j) const {
  j["core_round_trip_ns_before"] = trip_before_;
  j["core_round_trip_ns_after"] = trip_after_;
  j["placement_changed"] = placement_changed(trip_before_, trip_after_);
  j["machine_peaks_changed"] = peaks_changed();
}

}  // namespace phaselab::cli
