#include "phaselab/schedule_policy.h"

#include <charconv>

namespace phaselab {

const char* const kSchedulePolicyHelp =
    "  prefill-first       a waiting prompt is prefilled whole before the decodes resume (they stall)\n"
    "  chunked[:N]         at most N tokens per pass, decodes first, prompts in chunks\n"
    "  chunked:auto        chunked, a pass with decodes taking the prompt tokens that add at most half a\n"
    "                      decode pass's time (measured as it runs): stalls of ~1.5 gaps (serve's default)\n"
    "  disaggregated:P+D   a prefill worker of P threads hands each prompt's K/V to a decode worker of D threads\n";

std::string SchedulePolicy::name() const {
  switch (kind) {
    case Kind::prefill_first:
      return "prefill-first";
    case Kind::chunked:
      if (timed) return "chunked:auto";
      return chunk_tokens > 0 ? "chunked:" + std::to_string(chunk_tokens) : "chunked";
    case Kind::disaggregated:
      return "disaggregated:" + std::to_string(prefill_threads) + "+" + std::to_string(decode_threads);
  }
  return "?";
}

namespace {

// A whole positive number in [1, max], else nothing.
bool read_count(std::string_view s, int max, int* out) {
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 1 || v > max) return false;
  *out = v;
  return true;
}

}  // namespace

Result<SchedulePolicy> parse_schedule_policy(std::string_view text) {
  const auto bad = [&](const std::string& why) -> Status {
    return invalid_argument("scheduling policy '" + std::string(text) + "': " + why + "; the policies are\n" +
                            kSchedulePolicyHelp);
  };
  SchedulePolicy p;
  if (text == "prefill-first") {
    p.kind = SchedulePolicy::Kind::prefill_first;
    return p;
  }
  if (text == "chunked") return p;
  if (text == "chunked:auto") {
    p.timed = true;
    return p;
  }
  if (text.starts_with("chunked:")) {
    if (!read_count(text.substr(8), 1 << 16, &p.chunk_tokens))
      return bad("N must be a token count from 1 to 65536, or auto");
    return p;
  }
  if (text.starts_with("disaggregated:")) {
    const std::string_view pd = text.substr(14);
    const size_t plus = pd.find('+');
    p.kind = SchedulePolicy::Kind::disaggregated;
    if (plus == std::string_view::npos || !read_count(pd.substr(0, plus), 256, &p.prefill_threads) ||
        !read_count(pd.substr(plus + 1), 256, &p.decode_threads))
      return bad("P+D must be two thread counts, e.g. disaggregated:1+1");
    return p;
  }
  return bad("unknown policy");
}

}  // namespace phaselab
