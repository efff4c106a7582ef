// The machine around a bench run, for bench and bench --batch: its peaks
// probed before and after the tests, each with a core round trip beside it,
// and the round trips around the tests themselves. A probe at a busy moment
// under-reads the machine and inflates every fraction; a VM's vCPUs can move
// between placements (one core, one shared cache, apart) from one minute to
// the next, and its speeds with them (docs/benchmarks.md).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "phaselab/machine.h"

namespace phaselab::cli {

class BenchProbes {
 public:
  // Before the tests: the first probe (a CPU backend's, unless skip) and a
  // round trip; the round trips around the tests where a CPU backend runs
  // on 2+ threads (on_cores).
  BenchProbes(const std::string& backend, bool skip, int n_threads);

  // The round trip just after the tests the placement lines speak for.
  void tests_done();
  // The second probe, after every test (read the peak RSS first: the probe
  // resets it). In the same placement as the first probe, the fractions
  // divide by the better of each figure (better_peaks); in another, by the
  // first, whose placement the tests started in.
  void probe_again();

  // What the fractions divide by: the merged probes or the first.
  const MachinePeaks& peaks() const { return best_; }
  // Both probes plausible and more than a tenth apart in a figure divided by.
  bool peaks_changed() const;

  // "machine probes differ: ..." where they do (else nothing), saying which
  // probe users (e.g. "the fractions below") take.
  void print_probe_line(const std::string& users) const;
  // "threads: ..." (on_cores) and a line where the placement changed during
  // the tests or stayed on one core's two hardware threads.
  void print_placement_lines() const;
  // core_round_trip_ns_before/_after, placement_changed, machine_peaks_changed.
  void add_json(nlohmann::json& j) const;

 private:
  std::string backend_;
  bool on_cores_ = false;
  MachinePeaks before_, after_, best_;  // after_: unset when not probed
  bool merged_ = false;
  double trip_probe_ = -1, trip_probe_after_ = -1;  // beside each probe
  double trip_before_ = -1, trip_after_ = -1;       // around the tests (on_cores)
};

}  // namespace phaselab::cli
