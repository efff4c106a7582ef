// The CUDA backend's step profile: CUDA events between the steps of a
// forward pass, summed by phase and step.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <string>
#include <vector>

#include "phaselab/status.h"

namespace phaselab {

// CudaSwitches::profile (PHASELAB_CUDA_PROFILE=1): where the time of a forward pass goes. CUDA
// events between the steps of every forward (the decode graph is off then,
// so each step is timed on its own, launch gaps included), summed by phase
// (prefill: a batch; decode: one token) and step over all layers, and
// printed to stderr when the backend goes.
class StepProfile {
 public:
  explicit StepProfile(bool on) : on_(on) {}
  ~StepProfile() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  bool on() const { return on_; }

  // Starts a forward pass's timeline on stream s.
  Status begin(cudaStream_t s) {
    used_ = 0;
    return mark(nullptr, s);
  }
  // The time since the previous mark was step name's.
  Status mark(const char* name, cudaStream_t s) {
    if (!on_) return Status::ok();
    if (used_ == static_cast<int>(events_.size())) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) return internal_error("CUDA profile: cudaEventCreate failed");
      events_.push_back(e);
      names_.push_back(nullptr);
    }
    names_[used_] = name;
    if (cudaEventRecord(events_[used_], s) != cudaSuccess) return internal_error("CUDA profile: cudaEventRecord failed");
    used_++;
    return Status::ok();
  }
  // After the stream has synchronised: adds this pass's steps to the totals
  // of its phase ("prefill": a pass with a prompt chunk; "decode": one token
  // per sequence), T rows.
  void collect(const char* phase, int T);
  // The totals as a table on stderr.
  void print() const;

 private:
  std::map<std::string, long> warmed_;  // passes seen per phase (the first is left out)
  struct Total {
    double ms = 0;
    long calls = 0;
  };
  bool on_ = false;
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> names_;
  int used_ = 0;
  std::map<std::string, std::map<std::string, Total>> totals_;
  std::map<std::string, long> passes_, tokens_;
};

}  // namespace phaselab
