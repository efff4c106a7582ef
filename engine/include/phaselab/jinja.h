// A Jinja interpreter for chat templates (tokenizer.chat_template).
//
// It runs the subset of Jinja that chat templates use, with the settings
// Hugging Face transformers renders them with (trim_blocks, lstrip_blocks,
// the loop controls, an immutable sandbox): text, {{ expressions }},
// {% if / for (else, loop.*, filters) / set (names, namespace attributes,
// blocks) / macro / call / filter / break / continue / generation %},
// whitespace control (-, +), comments; Python's literals and operators,
// the filters and tests templates call, the methods of str / dict / list
// that do not modify anything, and the globals raise_exception, range,
// namespace, dict and strftime_now. What it does not know is an error, never
// a silent guess.
//
// Sandboxed: a template is data from a downloaded file. Rendering is bounded
// in steps, wall time, output size and recursion depth; nothing it does
// reaches outside the values it is given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace phaselab::jinja {

// A template that does not parse, a render that fails (raise_exception, an
// undefined value used, a type error) or exceeds its limits.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Limits {
  uint64_t max_steps = 50'000'000;     // expression and statement evaluations
  double max_seconds = 5.0;            // wall time of one render
  size_t max_output = 16u << 20;       // bytes of output
  int max_depth = 256;                 // nesting of expressions, statements and macro calls
};

struct RenderOptions {
  Limits limits;
  // strftime_now()'s clock (local time, as transformers'); nullopt: now.
  std::optional<std::time_t> now;
};

class Template {
 public:
  // Throws Error (with the line) when source does not parse.
  explicit Template(std::string_view source, const Limits& limits = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // context: a JSON object whose members are the template's variables
  // (messages, add_generation_prompt, bos_token, ...), in their order.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Parses and renders in one call.
std::string render(std::string_view source, const nlohmann::ordered_json& context,
                   const RenderOptions& options = {});

}  // namespace phaselab::jinja
