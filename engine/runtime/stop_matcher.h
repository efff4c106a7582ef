// Stop strings in streamed text, shared by Session and the batch Scheduler.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace phaselab {

// Holds back text that might be the start of a stop string, so that a stop
// string is never streamed out before it is recognised.
class StopMatcher {
 public:
  explicit StopMatcher(const std::vector<std::string>& stops) : stops_(stops) {}
  // Appends text; returns true when a stop string is complete. Text that is
  // safe to show is moved to *out.
  bool push(std::string_view text, std::string* out) {
    held_ += text;
    for (const auto& s : stops_) {
      if (s.empty()) continue;
      if (auto at = held_.find(s); at != std::string::npos) {
        *out += held_.substr(0, at);
        held_.clear();
        return true;
      }
    }
    // Keep the longest suffix of held_ that is a prefix of some stop string.
    size_t keep = 0;
    for (const auto& s : stops_)
      for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; k--)
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
    *out += held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return false;
  }
  std::string flush() { return std::exchange(held_, {}); }

 private:
  const std::vector<std::string>& stops_;
  std::string held_;
};

}  // namespace phaselab
