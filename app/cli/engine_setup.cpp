#include "engine_setup.h"

#include <thread>

namespace phaselab::cli {

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

Result<EngineSetup> open_session(const Args& args, int default_ctx) {
  const auto path = args.get("--model");
  if (!path) return invalid_argument("no model given: pass -m MODEL.gguf (scripts/fetch-model.sh gets the default one)");
  auto threads = args.get_int("--threads", default_threads(), 1, 256);
  if (!threads) return threads.status();
  auto ctx = args.get_int("--ctx-size", default_ctx, 0, 1 << 20);
  if (!ctx) return ctx.status();
  auto batch = args.get_int("--batch-size", 64, 1, 4096);
  if (!batch) return batch.status();
  const std::string backend = args.get_or("--backend", "cpu");
  if (backend != "cpu" && backend != "cpu-reference" && backend != "cpu-portable")
    return invalid_argument("unknown backend '" + backend + "' (available: cpu, cpu-portable, cpu-reference)");

  auto model = Model::load(*path);
  if (!model) return model.status();
  EngineSetup s;
  s.model = std::move(*model);
  auto b = backend == "cpu-reference" ? make_cpu_reference_backend(s.model, *threads, *batch)
                                      : make_cpu_backend(s.model, *threads, *batch, backend == "cpu-portable");
  if (!b) return b.status();
  auto session = Session::create(s.model, std::move(*b), *ctx);
  if (!session) return session.status();
  s.session = std::move(*session);
  s.chat_family = s.model->chat_template();
  return s;
}

}  // namespace phaselab::cli
