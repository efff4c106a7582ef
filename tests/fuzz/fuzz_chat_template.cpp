// Fuzz target: chat template detection and rendering with random
// conversations. Input: byte 0 picks the family (mod the number of families) and
// add_generation_prompt (bit 3); the rest is messages separated by 0x00,
// each a role byte (system, user, assistant, or - for other values - the
// role name "tool") followed by its content. The whole input is also given
// to detect_chat_template as a template source, and to the Jinja interpreter
// as a template (a hostile tokenizer.chat_template): it parses or is refused
// with an Error, and renders those messages or is refused, within its limits.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"
#include "phaselab/chat_template.h"
#include "phaselab/jinja.h"

using namespace phaselab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const ChatTemplateFamily detected = detect_chat_template(all);
  FUZZ_CHECK(std::string_view(chat_template_family_name(detected)).size() > 0);
  if (size < 1) return 0;

  static const std::vector<ChatTemplateFamily> kFamilies = chat_template_families();
  const ChatTemplateFamily family = kFamilies[data[0] % kFamilies.size()];
  FUZZ_CHECK(chat_template_family_from_name(chat_template_family_name(family)) == family);
  const bool gen = data[0] & 8;
  std::vector<ChatMessage> msgs;
  std::string_view rest = all.substr(1);
  while (!rest.empty()) {
    const size_t end = rest.find('\0');
    std::string_view m = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    if (m.empty()) continue;
    static const char* const kRoles[] = {"system", "user", "assistant", "tool"};
    msgs.push_back({kRoles[std::min<unsigned>(static_cast<uint8_t>(m[0]) % 8, 3)], std::string(m.substr(1))});
  }

  const std::string out = apply_chat_template(family, msgs, gen);
  // Every user and assistant turn is in the prompt, whatever the family.
  for (const ChatMessage& m : msgs) {
    if (m.role == "user" || m.role == "assistant") FUZZ_CHECK(out.find(m.content) != std::string::npos);
  }
  // Families that give every role its own turn keep system messages too.
  if (family == ChatTemplateFamily::chatml || family == ChatTemplateFamily::llama3 || family == ChatTemplateFamily::plain ||
      family == ChatTemplateFamily::plain_fewshot) {
    for (const ChatMessage& m : msgs) FUZZ_CHECK(out.find(m.content) != std::string::npos);
  }
  for (const std::string& s : chat_stop_strings(family)) FUZZ_CHECK(!s.empty());

  // The input as a Jinja template, small limits so that each run is quick.
  jinja::RenderOptions opts;
  opts.limits.max_steps = 20000;
  opts.limits.max_output = 1 << 20;
  opts.limits.max_depth = 64;
  opts.now = 0;
  try {
    jinja::Template t(all, opts.limits);
    nlohmann::ordered_json ctx;
    ctx["messages"] = nlohmann::ordered_json::array();
    for (const ChatMessage& m : msgs) ctx["messages"].push_back({{"role", m.role}, {"content", m.content}});
    ctx["add_generation_prompt"] = gen;
    ctx["bos_token"] = "<s>";
    ctx["eos_token"] = "</s>";
    const std::string text = t.render(ctx, opts);
    FUZZ_CHECK(text.size() <= opts.limits.max_output);
  } catch (const jinja::Error&) {
    // refused, with a message: fine
  }
  return 0;
}
