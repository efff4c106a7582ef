// JSON text from an untrusted source (a string inside a request, a model's
// output) parsed with its nesting bounded: nlohmann's parser keeps its own
// stack, but what walks the result (dump, the template interpreter's
// values) recurses, so text nested thousands deep must not get that far.
#pragma once

#include <nlohmann/json.hpp>
#include <string_view>

namespace phaselab {

constexpr int kMaxJsonNesting = 32;

// J (nlohmann::json or ordered_json) of text; discarded (is_discarded())
// when it is not JSON or is nested deeper than max_depth.
template <typename J>
J parse_json_bounded(std::string_view text, int max_depth = kMaxJsonNesting) {
  struct TooDeep {};
  try {
    return J::parse(text, [max_depth](int depth, typename J::parse_event_t, J&) {
      if (depth > max_depth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
  } catch (const typename J::exception&) {
  }
  return J(J::value_t::discarded);
}

}  // namespace phaselab
