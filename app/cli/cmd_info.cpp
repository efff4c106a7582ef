// phaselab-cli info MODEL [--json]: what a GGUF file holds, and whether
// PhaseLab can run it. The file goes through the same checks as loading it
// for generation (config, tokenizer, every tensor's presence, shape and
// type, the backend's own limits) without computing anything; a file that
// would not load is reported with exit 2 after the metadata it could read.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/backend.h"
#include "phaselab/chat_template.h"
#include "phaselab/gguf.h"
#include "phaselab/jinja.h"
#include "phaselab/model.h"
#include "phaselab/model_config.h"

namespace phaselab::cli {

namespace {

struct TypeStats {
  int tensors = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
};

std::string human_count(double n) {
  char buf[32];
  if (n >= 1e9) std::snprintf(buf, sizeof buf, "%.2f B", n / 1e9);
  else if (n >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", n / 1e6);
  else if (n >= 1e3) std::snprintf(buf, sizeof buf, "%.2f K", n / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  return buf;
}

// Everything `generate` checks before its first forward pass: the model
// (config, vocabulary, tensors) and the CPU backend's limits (one thread, a
// batch of one: no large buffers, no KV cache).
Status check_loadable(const std::shared_ptr<GgufFile>& file) {
  auto model = Model::from_file(file);
  if (!model) return model.status();
  auto backend = make_cpu_reference_backend(*model, 1, 1);
  if (!backend) return backend.status().with_context(file->path());
  return Status::ok();
}

}  // namespace

int cmd_info(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {{"--json", "", false}, {"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help") || args->positional().size() != 1) {
    std::fprintf(args->has("--help") ? stdout : stderr, "usage: phaselab-cli info MODEL.gguf [--json]\n");
    return args->has("--help") ? kExitOk : kExitBadInput;
  }
  const std::string path = args->positional()[0];
  auto file = GgufFile::open(path);
  if (!file) return report(file.status());
  const GgufFile& f = **file;

  std::map<std::string, TypeStats> types;
  uint64_t n_params = 0;
  for (const auto& t : f.tensors()) {
    auto& s = types[std::string(tensor_type_name(t.type))];
    s.tensors++;
    s.elements += t.n_elements;
    s.bytes += t.n_bytes;
    n_params += t.n_elements;
  }
  auto cfg = ModelConfig::from_gguf(f);
  const Status loadable = check_loadable(*file);
  const std::string tok_model(f.get_string("tokenizer.ggml.model").value_or(""));
  const std::string tok_pre(f.get_string("tokenizer.ggml.pre").value_or(""));
  const GgufValue* toks = f.find("tokenizer.ggml.tokens");
  const uint64_t n_tokens = toks && toks->type == GgufValueType::ARRAY ? toks->count : 0;
  const auto tmpl = f.get_string("tokenizer.chat_template");
  const std::string family = tmpl ? chat_template_family_name(detect_chat_template(*tmpl)) : "none";
  // Whether PhaseLab's Jinja interpreter parses the template (it renders
  // chats when it does; the family when it does not).
  std::string template_error;
  if (tmpl) {
    try {
      jinja::Template parsed(*tmpl);
    } catch (const jinja::Error& e) {
      template_error = e.what();
    }
  }

  if (args->has("--json")) {
    nlohmann::json j;
    j["file"] = path;
    j["file_size"] = f.file_size();
    j["gguf_version"] = f.version();
    j["alignment"] = f.alignment();
    j["n_tensors"] = f.tensors().size();
    j["n_params"] = n_params;
    j["architecture"] = std::string(f.get_string("general.architecture").value_or(""));
    j["name"] = std::string(f.get_string("general.name").value_or(""));
    j["supported"] = cfg.is_ok();
    if (!cfg.is_ok()) j["unsupported_reason"] = cfg.status().message();
    j["loadable"] = loadable.is_ok();
    if (!loadable.is_ok()) j["load_error"] = loadable.message();
    if (cfg.is_ok()) {
      const ModelConfig& c = *cfg;
      j["hparams"] = {{"n_vocab", c.n_vocab},      {"n_ctx_train", c.n_ctx_train}, {"n_embd", c.n_embd},
                      {"n_layer", c.n_layer},      {"n_head", c.n_head},           {"n_head_kv", c.n_head_kv},
                      {"head_dim", c.head_dim},    {"n_ff", c.n_ff},               {"n_rot", c.n_rot},
                      {"rms_eps", c.rms_eps},      {"rope_base", c.rope_base},     {"rope_base_swa", c.rope_base_swa},
                      {"rope_neox", c.rope_neox},  {"sliding_window", c.sliding_window},
                      {"n_swa_layers", std::count(c.layer_is_swa.begin(), c.layer_is_swa.end(), 1)},
                      {"n_expert", c.n_expert},    {"n_expert_used", c.n_expert_used}, {"n_ff_exp", c.n_ff_exp}};
    }
    nlohmann::json jt = nlohmann::json::object();
    for (const auto& [name, s] : types) jt[name] = {{"tensors", s.tensors}, {"elements", s.elements}, {"bytes", s.bytes}};
    j["tensor_types"] = jt;
    j["vocab"] = {{"model", tok_model}, {"pre", tok_pre}, {"n_tokens", n_tokens},
                  {"bos", f.get_int("tokenizer.ggml.bos_token_id").value_or(-1)},
                  {"eos", f.get_int("tokenizer.ggml.eos_token_id").value_or(-1)}};
    j["chat_template"] = {{"present", tmpl.has_value()}, {"family", family}, {"parses", tmpl && template_error.empty()}};
    if (!template_error.empty()) j["chat_template"]["error"] = template_error;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    std::fflush(stdout);
    return loadable.is_ok() ? kExitOk : report(loadable);
  }

  std::printf("file            %s\n", path.c_str());
  std::printf("size            %s (%llu bytes), GGUF v%u, alignment %llu\n", mib(f.file_size()).c_str(),
              static_cast<unsigned long long>(f.file_size()), f.version(),
              static_cast<unsigned long long>(f.alignment()));
  std::printf("architecture    %s%s%s\n", std::string(f.get_string("general.architecture").value_or("?")).c_str(),
              f.get_string("general.name") ? "  -  " : "", std::string(f.get_string("general.name").value_or("")).c_str());
  std::printf("parameters      %s in %zu tensors\n", human_count(static_cast<double>(n_params)).c_str(), f.tensors().size());
  if (cfg.is_ok()) {
    const ModelConfig& c = *cfg;
    std::printf("context         %d tokens (trained)\n", c.n_ctx_train);
    if (c.is_moe())
      std::printf("layers          %d, n_embd %d; mixture of experts: %d of %d experts of n_ff %d per token\n", c.n_layer,
                  c.n_embd, c.n_expert_used, c.n_expert, c.n_ff_exp);
    else
      std::printf("layers          %d, n_embd %d, n_ff %d\n", c.n_layer, c.n_embd, c.n_ff);
    std::printf("attention       %d heads, %d KV heads, head_dim %d, scale %.6g%s\n", c.n_head, c.n_head_kv, c.head_dim,
                c.attn_scale, c.attn_sinks ? "; a sink logit per head" : "");
    std::printf("rope            %s, n_rot %d, base %g", c.rope_neox ? "NeoX" : "normal", c.n_rot, c.rope_base);
    if (c.sliding_window) std::printf(" (sliding-window layers: base %g)", c.rope_base_swa);
    if (c.yarn_ext_factor != 0) std::printf("; YaRN, factor %g over %d tokens", 1.0 / c.rope_freq_scale, c.n_ctx_orig);
    else if (c.rope_freq_scale != 1) std::printf("; linear scaling, factor %g", 1.0 / c.rope_freq_scale);
    std::printf("\n");
    if (c.sliding_window) {
      int n_swa = 0;
      std::string globals;
      for (int il = 0; il < c.n_layer; il++) {
        if (c.is_swa(il)) n_swa++;
        else globals += (globals.empty() ? "" : ",") + std::to_string(il);
      }
      std::printf("sliding window  %d tokens on %d layers; global layers %s\n", c.sliding_window, n_swa, globals.c_str());
    }
    std::printf("rms eps         %g\n", c.rms_eps);
  }
  std::printf("tensor types   ");
  for (const auto& [name, s] : types)
    std::printf(" %s: %d (%s, %s params)", name.c_str(), s.tensors, mib(s.bytes).c_str(), human_count(static_cast<double>(s.elements)).c_str());
  std::printf("\n");
  std::printf("vocabulary      %s%s%s, %llu tokens, bos %lld, eos %lld\n", tok_model.empty() ? "none" : tok_model.c_str(),
              tok_pre.empty() ? "" : " / pre ", tok_pre.c_str(), static_cast<unsigned long long>(n_tokens),
              static_cast<long long>(f.get_int("tokenizer.ggml.bos_token_id").value_or(-1)),
              static_cast<long long>(f.get_int("tokenizer.ggml.eos_token_id").value_or(-1)));
  const std::string tmpl_line =
      !tmpl ? "no"
            : template_error.empty() ? "yes, rendered by its Jinja template (" + family + " stop strings)"
                                     : "yes, but it does not parse (" + template_error + "): the built-in '" + family +
                                           "' format renders instead";
  std::printf("chat template   %s\n", tmpl_line.c_str());
  std::printf("loadable        %s%s\n", loadable.is_ok() ? "yes" : "no: ", loadable.is_ok() ? "" : loadable.message().c_str());
  std::fflush(stdout);
  return loadable.is_ok() ? kExitOk : report(loadable);
}

}  // namespace phaselab::cli
