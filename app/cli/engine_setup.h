// Opening a model and a session from the common command-line options.
#pragma once

#include <memory>

#include "cli_util.h"
#include "phaselab/chat_template.h"
#include "phaselab/session.h"
#include "phaselab/speculative.h"

namespace phaselab::cli {

struct EngineSetup {
  std::shared_ptr<Model> model;
  std::unique_ptr<Session> session;
  ChatFormat chat_format;  // the model's own template, or its family
  std::unique_ptr<DraftSource> draft;  // --spec lookup|draft; null for none
  int spec_k = 4;
};

// The model (--model) and its backend (--backend, --threads, --batch-size;
// set_model_batch when absent); a CUDA fallback's reason goes to stderr.
struct ModelAndBackend {
  std::shared_ptr<Model> model;
  std::unique_ptr<Backend> backend;
  int threads = 0;
};
Result<ModelAndBackend> open_model_and_backend(const Args& args, int default_max_batch = 64);
// The backend options alone (--backend, --threads, --batch-size): for
// create_scheduler, which makes the backends a scheduling policy needs.
Result<BackendOptions> backend_options_from_args(const Args& args, int default_max_batch = 64);
// Once the model is loaded, without --batch-size: the larger of the
// command's default and the backend's for this model (set_default_passes:
// with --backend cuda, the CPU fallback's by the CPU's rule).
void set_model_batch(const Args& args, const Model& model, int command_default, BackendOptions* bo);

// Reads --model, --threads, --ctx-size, --backend, --batch-size, and the
// speculative options --spec none|lookup|draft, --draft MODEL, --spec-k K.
// default_ctx: the context when --ctx-size is absent (0: the model's, at most 4096).
// chat: a session for several turns (Session::create's chat: room for the
// window at each prompt's end); one-shot commands pass false.
Result<EngineSetup> open_session(const Args& args, int default_ctx = 0, bool chat = false);
int default_threads();
// --cache-type (f16 by default).
Result<KvType> cache_type(const Args& args);
// The options every model-running command accepts.
const std::vector<OptionSpec>& engine_options();
extern const char* const kEngineHelp;
// -n, --temp, --top-k, --top-p, --min-p, the penalties, --seed, --stop, --ignore-eos.
const std::vector<OptionSpec>& sampling_options();
// Reads them (and --no-kv-cache, --no-prefix-cache) into o; the first bad one is the error.
Status read_generate_options(const Args& a, GenerateOptions* o);
extern const char* const kSamplingHelp;

}  // namespace phaselab::cli
