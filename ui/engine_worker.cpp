#include "engine_worker.h"

#include <QFileInfo>
#include <algorithm>
#include <chrono>
#include <exception>
#include <random>
#include <thread>

#include "engine_controller.h"
#include "phaselab/chat_template.h"
#include "phaselab/log.h"
#include "phaselab/machine.h"
#include "phaselab/metrics.h"
#include "phaselab/openai_server.h"
#include "phaselab/prompt.h"
#include "phaselab/remote_client.h"
#include "phaselab/scheduler.h"
#include "phaselab/session.h"
#include "phaselab/speculative.h"

namespace phaselab::ui {

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// One per physical core, as in phaselab-cli. (It was all cores but one while
// the pool spun without sleeping and starved the GUI thread; its workers now
// spin briefly, yield, then sleep, and on a loaded 2-core machine 2 threads
// left the GUI thread's longest stall as short as 1 thread did.)
int defaultThreads() { return phaselab::default_thread_count(); }

RequestStats toStats(const RequestMetrics& m, const QString& backend) {
  RequestStats s;
  s.nPrompt = m.n_prompt;
  s.nReused = m.n_reused;
  s.nGenerated = m.n_generated;
  s.ttftMs = m.ttft_ms;
  s.prefillMs = m.prefill_ms;
  s.prefillTps = m.prefill_tps;
  s.decodeMs = m.decode_ms;
  s.decodeTps = m.decode_tps;
  s.kvUsed = m.kv_used;
  s.kvCapacity = m.kv_capacity;
  s.specDrafted = m.spec_drafted;
  s.specAccepted = m.spec_accepted;
  s.tokensPerPass = m.tokens_per_pass;
  s.stopReason = QString::fromLatin1(to_string(m.stop_reason));
  s.backend = backend;
  return s;
}

// The server's share of the machine: as many sequences per pass as a small
// local server needs.
constexpr int kServeMaxSeqs = 8;

}  // namespace

EngineWorker::EngineWorker(std::shared_ptr<EngineShared> shared, QObject* parent)
    : QObject(parent), m_shared(std::move(shared)) {}

EngineWorker::~EngineWorker() = default;

void EngineWorker::loadModel(const QString& path, const EngineConfig& config) {
  try {
    loadModelImpl(path, config);
  } catch (const std::exception& e) {
    emit modelLoadFailed(QStringLiteral("loading %1: %2").arg(path, QString::fromUtf8(e.what())), current());
  } catch (...) {
    emit modelLoadFailed(QStringLiteral("loading %1: unknown error").arg(path), current());
  }
}

// A model and the session over it, built but not yet installed.
struct EngineWorker::Built {
  std::shared_ptr<Model> model;
  std::unique_ptr<Session> session;
  int threads = 0;
  std::string fallbackReason;  // why the device asked for is not used (the CPU runs the model)
};

Result<EngineWorker::Built> EngineWorker::build(const QString& path, const EngineConfig& config) const {
  auto model = Model::load(path.toStdString());
  if (!model) return model.status();
  if (m_shared->loadCancel.load()) return Status(StatusCode::cancelled, "the load was cancelled");
  Built b;
  b.threads = config.threads > 0 ? config.threads : defaultThreads();
  b.model = std::move(*model);
  auto kind = parse_backend_kind(config.backend.toStdString());
  if (!kind) return kind.status();
  BackendOptions bo = backend_options_from_environment();
  bo.kind = *kind;
  bo.n_threads = b.threads;
  set_default_passes(&bo, *b.model);
  auto backend = make_backend(b.model, bo);
  if (!backend) return backend.status();
  b.fallbackReason = backend->fallback_reason;
  // An unknown stored value (a settings file from elsewhere) takes the default.
  const KvType kvType = kv_type_from_name(config.kvType.toStdString()).value_or(KvType::f16);
  auto session = Session::create(b.model, std::move(backend->backend), config.contextSize, kvType);
  if (!session) return session.status();
  if (m_shared->loadCancel.load()) return Status(StatusCode::cancelled, "the load was cancelled");
  b.session = std::move(*session);
  return b;
}

void EngineWorker::loadModelImpl(const QString& path, const EngineConfig& config) {
  // Load first, swap after: a file that is not a model, an architecture
  // PhaseLab does not run or a setting the model refuses leaves the working
  // model where it was. The new one is built beside it; only when memory
  // cannot hold both does the old one go first, and it is loaded again (with
  // its own settings) if the new one fails after all.
  const bool hadModel = m_session != nullptr;
  auto built = build(path, config);
  if (!built && built.status().code() == StatusCode::out_of_memory && hadModel) {
    const QString oldPath = m_path;
    const EngineConfig oldConfig = m_config;
    releaseModel();
    built = build(path, config);
    if (!built && !m_shared->loadCancel.load()) {
      auto again = build(oldPath, oldConfig);
      if (again) install(oldPath, oldConfig, std::move(*again));
    }
  }
  if (!built) {
    // What is loaded now (the previous model, or nothing) goes with the
    // failure, so the window keeps showing it.
    const ModelInfo kept = current();
    if (built.status().code() == StatusCode::cancelled)
      emit modelLoadCancelled(kept);
    else
      emit modelLoadFailed(QString::fromStdString(built.status().message()), kept);
    return;
  }
  // The server serves the session it was started with: it stops before the
  // swap (the window starts it again for the new model).
  stopServerImpl();
  m_remote.reset();
  const std::string fallback = built->fallbackReason;
  install(path, config, std::move(*built));
  if (!fallback.empty()) emit errorOccurred(QString::fromStdString(fallback) + QStringLiteral("; using the CPU backend"));
  emit modelLoaded(describe());
}

void EngineWorker::install(const QString& path, const EngineConfig& config, Built built) {
  m_session = std::move(built.session);  // the old session goes before its model
  m_model = std::move(built.model);
  m_path = path;
  m_config = config;
  m_threads = built.threads;
  m_draft.reset();  // a draft model's session is sized for the old target
  m_draftPath.clear();
  m_self.reset();
}

ModelInfo EngineWorker::describe() const {
  const Model& m = *m_model;
  ModelInfo info;
  const ModelConfig& c = m.config();
  info.path = m_path;
  info.name = c.name.empty() ? QFileInfo(m_path).completeBaseName() : QString::fromStdString(c.name);
  info.architecture = QString::fromStdString(c.arch_str);
  info.nParams = static_cast<qint64>(parameter_count(m));
  info.nParamsActive = static_cast<qint64>(active_parameter_count(m));
  info.experts = c.n_expert;
  info.expertsUsed = c.n_expert_used;
  info.prefillOpsPerToken = prefill_ops_per_token(m);
  info.maxBatch = m_session->backend().max_batch();
  info.typeMix = QString::fromStdString(m.type_mix());
  info.contextTrained = c.n_ctx_train;
  info.contextSize = m_session->n_ctx();
  info.kvType = QString::fromLatin1(kv_type_name(m_session->kv().type()));
  info.kvBytes = m_session->kv_bytes();
  info.kvBlocks = m_session->kv().pool().n_blocks();
  info.kvWindowNote = QString::fromStdString(m_session->kv().pool().window_note());
  info.fileSize = static_cast<qint64>(m.file().file_size());
  info.weightBytes = m.active_weight_bytes();
  info.chatTemplate = QString::fromStdString(chat_format_name(m.chat_format()));
  info.hasChatTemplate = m.has_chat_template();
  if (!m.chat_template_error().empty())
    spdlog::warn("{}: its chat template does not parse: {}", m.path(), m.chat_template_error());
  info.backend = QString::fromStdString(m_session->backend().name());
  info.threads = m_threads;
  info.config = m_config;
  return info;
}

void EngineWorker::releaseModel() {
  stopServerImpl();
  m_remote.reset();
  m_self.reset();  // it holds the model
  m_session.reset();
  m_model.reset();
  m_path.clear();
}

void EngineWorker::unloadModel() {
  try {
    releaseModel();
    emit modelUnloaded();
  } catch (...) {
    emit errorOccurred(QStringLiteral("unloading the model failed"));
  }
}

void EngineWorker::connectRemote(const RemoteConfig& remote) {
  try {
    connectRemoteImpl(remote);
  } catch (const std::exception& e) {
    emit modelLoadFailed(QStringLiteral("connecting to %1: %2").arg(remote.url, QString::fromUtf8(e.what())), current());
  } catch (...) {
    emit modelLoadFailed(QStringLiteral("connecting to %1: unknown error").arg(remote.url), current());
  }
}

void EngineWorker::connectRemoteImpl(const RemoteConfig& remote) {
  // As a load: what is loaded stays until the server has answered.
  if (remote.url.trimmed().isEmpty()) {
    emit modelLoadFailed(tr("No remote server URL: enter the API's base in Settings (e.g. http://127.0.0.1:8080/v1)"),
                         current());
    return;
  }
  RemoteEndpoint ep;
  ep.url = remote.url.trimmed().toStdString();
  ep.api_key = remote.apiKey.trimmed().toStdString();
  ep.model = remote.model.trimmed().toStdString();
  // Asks the server for its models: the error says whether it could not be
  // reached, refused the key or lacks the model. Not interruptible (at most
  // the connection timeout); Cancel drops the result.
  auto client = RemoteClient::connect(ep);
  if (!client) {
    emit modelLoadFailed(QString::fromStdString(client.status().message()), current());
    return;
  }
  if (m_shared->loadCancel.load()) {
    emit modelLoadCancelled(current());
    return;
  }
  releaseModel();
  m_remote = std::move(*client);
  m_draft.reset();
  m_draftPath.clear();
  emit modelLoaded(current());
}

ModelInfo EngineWorker::current() const {
  if (m_session) return describe();
  if (!m_remote) return {};
  // What only the server knows stays empty: the GUI shows "—" or "remote".
  ModelInfo info;
  info.remote = true;
  info.remoteUrl = QString::fromStdString(m_remote->url());
  info.remoteModel = QString::fromStdString(m_remote->model());
  info.path = info.remoteUrl;
  info.name = info.remoteModel;
  info.architecture = QStringLiteral("remote");
  info.typeMix = QStringLiteral("remote");
  info.backend = QStringLiteral("remote");
  // The server applies its own chat template to the messages.
  info.chatTemplate = QStringLiteral("the server's");
  info.hasChatTemplate = true;
  return info;
}

void EngineWorker::startServer(int port) {
  try {
    startServerImpl(port);
  } catch (const std::exception& e) {
    emit serverFailed(QStringLiteral("starting the server: %1").arg(QString::fromUtf8(e.what())));
  } catch (...) {
    emit serverFailed(QStringLiteral("starting the server: unknown error"));
  }
}

void EngineWorker::stopServer() {
  try {
    stopServerImpl();
  } catch (...) {
    emit errorOccurred(QStringLiteral("stopping the server failed"));
  }
}

void EngineWorker::stopServerImpl() {
  if (!m_server) return;
  // Stops accepting, cancels what runs and joins the server's threads.
  m_server->stop();
  m_server.reset();
  emit serverStopped();
}

void EngineWorker::startServerImpl(int port) {
  stopServerImpl();
  if (m_remote) {
    emit serverFailed(tr("Serving needs a local model: the chat is connected to a remote server (%1). Load a GGUF "
                         "model to serve it.").arg(QString::fromStdString(m_remote->url())));
    return;
  }
  if (!m_session || !m_model) {
    emit serverFailed(tr("No model is loaded: load one and PhaseLab serves it."));
    return;
  }
  if (port < 0 || port > 65535) {
    emit serverFailed(tr("Port %1 is not a TCP port: choose one from 1 to 65535 (0: any free one).").arg(port));
    return;
  }
  auto portInUse = [&] {
    emit serverFailed(tr("Cannot serve on 127.0.0.1:%1: the port is in use (another server, or another PhaseLab?). "
                         "Choose another port in Settings (0 picks a free one).").arg(port));
  };
  // A second backend over the same weights, made the way the chat's was: the
  // server's threads step its own scheduler, never the chat's session.
  auto kind = parse_backend_kind(m_config.backend.toStdString());  // the chat's, so known
  if (!kind) {
    emit serverFailed(QString::fromStdString(kind.status().message()));
    return;
  }
  BackendOptions bo = backend_options_from_environment();
  bo.kind = *kind;
  bo.n_threads = m_threads;
  set_default_passes(&bo, *m_model, kServeMaxSeqs);
  auto backend = make_backend(m_model, bo);
  if (!backend) {
    emit serverFailed(QString::fromStdString(backend.status().message()));
    return;
  }
  if (!backend->fallback_reason.empty())
    emit errorOccurred(QString::fromStdString(backend->fallback_reason) + tr("; the server uses the CPU backend"));
  SchedulerOptions so;
  so.n_ctx = m_session->n_ctx();
  so.max_seqs = kServeMaxSeqs;
  so.kv_type = m_session->kv().type();  // the storage the settings chose for the local chat
  so.policy.timed = true;               // chunked:auto, as `phaselab-cli serve`: short stalls for streaming clients
  auto scheduler = Scheduler::create(m_model, std::move(backend->backend), so);
  if (!scheduler) {
    emit serverFailed(QString::fromStdString(scheduler.status().message()));
    return;
  }
  ServerOptions opt;
  opt.host = "127.0.0.1";  // loopback only: the GUI has no API key to protect a network bind
  opt.port = port;
  auto server = OpenAiServer::create(std::move(*scheduler), opt);
  if (!server) {
    emit serverFailed(QString::fromStdString(server.status().message()));
    return;
  }
  if (Status st = (*server)->start(); !st) {
    // The engine's message names the CLI's flags; say what to do here.
    spdlog::warn("gui: {}", st.message());
    return portInUse();
  }
  m_server = std::move(*server);
  emit serverStarted(QString::fromStdString(m_server->base_url()));
}

void EngineWorker::generate(int requestId, const QList<ChatTurn>& turns, const GenerationSettings& settings) {
  try {
    generateImpl(requestId, turns, settings);
  } catch (const std::exception& e) {
    RequestStats s;
    s.error = QString::fromUtf8(e.what());
    emit errorOccurred(s.error);
    emit generationFinished(requestId, s);
  } catch (...) {
    RequestStats s;
    s.error = QStringLiteral("unknown error in the engine");
    emit errorOccurred(s.error);
    emit generationFinished(requestId, s);
  }
}

namespace {

// The settings as the engine's options; a remote server gets the sampling
// fields an OpenAI-compatible server reads (remote_sampling_fields).
GenerateOptions generateOptions(const GenerationSettings& settings) {
  GenerateOptions opt;
  opt.n_predict = settings.maxTokens;
  opt.use_kv_cache = settings.useKvCache;
  opt.ignore_eos = settings.ignoreEos;
  opt.sampling.temperature = settings.temperature;
  opt.sampling.top_k = settings.topK;
  opt.sampling.top_p = settings.topP;
  opt.sampling.min_p = settings.minP;
  opt.sampling.repeat_penalty = settings.repeatPenalty;
  opt.sampling.seed = settings.seed != 0 ? settings.seed : std::random_device{}();
  opt.prefix_cache = settings.prefixCache;
  opt.spec_k = std::clamp(settings.specK, 1, kMaxSpecK);
  return opt;
}

// Notebook: the document so far, as written (the person's text and the
// model's continuations joined with nothing added). Chat: the turns, after
// the conversation's system prompt when it has one.
PromptInput promptInput(const QList<ChatTurn>& turns, const GenerationSettings& settings, bool notebook) {
  if (notebook) {
    std::string text;
    for (const ChatTurn& t : turns) text += t.content.toStdString();
    return PromptInput::text_of(std::move(text));
  }
  std::vector<ChatMessage> messages;
  for (const ChatTurn& t : turns) messages.push_back({t.role.toStdString(), t.content.toStdString()});
  const bool system = !settings.systemPrompt.trimmed().isEmpty();
  return PromptInput::chat_of(std::move(messages), system ? settings.systemPrompt.toStdString() : std::string());
}

}  // namespace

// Turns the engine's per-token events into the worker's signals: the first
// token at once (it is the TTFT the user waits for), then text deltas at most
// every kDeltaIntervalMs and metrics every kMetricsIntervalMs.
class EngineWorker::StreamRelay {
 public:
  StreamRelay(EngineWorker& w, int requestId, bool remote) : m_w(w), m_requestId(requestId), m_remote(remote) {
    m_live.requestId = requestId;
    m_live.phase = Phase::prefill;
    m_live.remote = remote;
  }
  LiveMetrics& live() { return m_live; }

  void onToken(const TokenEvent& e) {
    // A remote server's events are pieces of text without ids (the ids are
    // the server's): each counts as one token, as the server streams them.
    const bool counted = e.id >= 0 || m_remote;
    if (counted) {
      m_nTokens = e.index + 1;
      m_w.m_shared->tokensGenerated.store(m_nTokens);
    }
    m_pending.append(e.text);
    m_pendingReasoning.append(e.reasoning);
    const double now = e.t_ms;
    if (e.index == 0 && counted) firstToken(e);
    if ((!m_pending.empty() || !m_pendingReasoning.empty()) && now - m_lastDeltaMs >= kDeltaIntervalMs) {
      flush();
      m_lastDeltaMs = now;
    }
    if (now - m_lastMetricsMs >= kMetricsIntervalMs) {
      m_live.nGenerated = m_nTokens;
      m_live.elapsedMs = now;
      // The chart's recent rate (tokens over the last update interval) is
      // the display's; every other figure comes from the engine (or, for a
      // remote server, from RemoteClient's client-side measurement).
      m_live.windowTps = (m_nTokens - m_tokensAtLastMetrics) / std::max((now - m_lastMetricsMs) / 1000.0, 1e-9);
      if (e.metrics) {
        m_live.decodeTps = e.metrics->decode_tps;
        m_live.kvUsed = e.metrics->kv_used;
        copySpeculative(*e.metrics);
      }
      emit m_w.metricsUpdated(m_live);
      m_lastMetricsMs = now;
      m_tokensAtLastMetrics = m_nTokens;
    }
  }

  void flush() {
    if (!m_pendingReasoning.empty()) {
      emit m_w.reasoningReady(m_requestId, QString::fromUtf8(m_pendingReasoning.data(),
                                                             static_cast<qsizetype>(m_pendingReasoning.size())));
      m_pendingReasoning.clear();
    }
    if (m_pending.empty()) return;
    emit m_w.tokensReady(m_requestId, QString::fromUtf8(m_pending.data(), static_cast<qsizetype>(m_pending.size())),
                         m_nTokens);
    m_pending.clear();
  }

  // The request's final figures, all from the engine (a remote server's
  // usage gives its prompt count).
  void finish(const RequestMetrics& m, double elapsedMs) {
    m_live.phase = Phase::done;
    m_live.nPrompt = m_remote ? m.n_prompt : m_live.nPrompt;
    m_live.nReused = m.n_reused;
    m_live.nGenerated = m.n_generated;
    m_live.ttftMs = m.ttft_ms;
    m_live.prefillMs = m.prefill_ms;
    m_live.prefillTps = m.prefill_tps;
    m_live.elapsedMs = elapsedMs;
    m_live.decodeTps = m.decode_tps;
    m_live.windowTps = (m.n_generated - m_tokensAtLastMetrics) / std::max((elapsedMs - m_lastMetricsMs) / 1000.0, 1e-9);
    m_live.kvUsed = m.kv_used;
    m_live.kvCapacity = m.kv_capacity;
    copySpeculative(m);
    m_live.kvBlocksUsed = m.kv_blocks_used;
    m_live.kvBlocksCached = m.kv_blocks_cached;
    m_live.kvBlocksShared = m.kv_blocks_shared;
    m_live.kvBlocksTotal = m.kv_blocks_total;
    emit m_w.metricsUpdated(m_live);
  }

 private:
  void firstToken(const TokenEvent& e) {
    m_live.phase = Phase::decode;
    if (e.metrics) {
      m_live.ttftMs = e.metrics->ttft_ms;
      m_live.prefillMs = e.metrics->prefill_ms;
      m_live.prefillTps = e.metrics->prefill_tps;
    }
    // The decode rate's first window starts here, not at submission (that
    // would fold the prefill time into it).
    m_lastMetricsMs = e.t_ms;
    m_tokensAtLastMetrics = 1;
    // The phase changes with the first token on screen, not an interval later.
    m_live.nGenerated = 1;
    m_live.elapsedMs = e.t_ms;
    m_live.windowTps = 0;
    emit m_w.metricsUpdated(m_live);
  }

  void copySpeculative(const RequestMetrics& m) {
    m_live.specDrafted = m.spec_drafted;
    m_live.specAccepted = m.spec_accepted;
    m_live.specAcceptance = m.spec_acceptance;
    m_live.tokensPerPass = m.tokens_per_pass;
  }

  EngineWorker& m_w;
  const int m_requestId;
  const bool m_remote;
  LiveMetrics m_live;
  std::string m_pending;  // text not sent yet
  std::string m_pendingReasoning;  // reasoning (harmony) not sent yet
  int m_nTokens = 0;
  double m_lastDeltaMs = -1e9, m_lastMetricsMs = 0;
  int m_tokensAtLastMetrics = 0;
};

void EngineWorker::generateImpl(int requestId, const QList<ChatTurn>& turns, const GenerationSettings& settings) {
  auto fail = [&](const QString& message) {
    RequestStats s;
    s.error = message;
    s.stopReason = QStringLiteral("error");
    emit errorOccurred(message);
    emit generationFinished(requestId, s);
  };
  const bool remote = m_remote != nullptr;
  if (!m_session && !remote) return fail(QStringLiteral("no model is loaded: open one with File > Open Model (Ctrl+O)"));
  const bool notebook = settings.mode == QLatin1String("notebook");
  GenerateOptions opt = generateOptions(settings);
  opt.think_is_reasoning = !notebook;  // a notebook shows the text as the model writes it
  // Local: the prompt's tokens and the template's stop strings. Remote: the
  // messages (the server applies its own chat template), or the notebook's text.
  const PromptInput input = promptInput(turns, settings, notebook);
  std::vector<TokenId> prompt;
  if (!remote) {
    const Model& model = m_session->model();
    // The model's own template, unless the person chose a built-in format.
    ChatFormat format = model.chat_format();
    if (!settings.chatTemplate.isEmpty()) {
      const auto chosen = chat_template_family_from_name(settings.chatTemplate.toStdString());
      if (!chosen) return fail(QStringLiteral("unknown chat template \"%1\": choose one in Chat > Conversation Settings")
                                   .arg(settings.chatTemplate));
      format = ChatFormat(*chosen);
    }
    RenderedPrompt rendered = render_prompt(model.tokenizer(), format, input);
    if (!rendered.template_fallback.empty())
      spdlog::warn("the model's chat template failed ({}); rendered with the built-in '{}' format instead",
                   rendered.template_fallback, chat_template_family_name(format.family));
    prompt = std::move(rendered.tokens);
    for (auto& s : rendered.stop) opt.stop.push_back(s);
    opt.draft = draftSource(settings);
  }
  if (Status st = opt.sampling.validate(); !st) return fail(QString::fromStdString(st.message()));

  const QString backendName = remote ? QStringLiteral("remote") : QString::fromStdString(m_session->backend().name());
  const auto t0 = Clock::now();
  StreamRelay relay(*this, requestId, remote);
  if (!remote) {
    LiveMetrics& live = relay.live();
    live.nPrompt = static_cast<int>(prompt.size());
    live.kvCapacity = static_cast<quint64>(m_session->n_ctx());
    live.kvUsed = static_cast<quint64>(m_session->kv().n_past());
    // What the cache will supply, so the live prefill rate counts only the
    // tokens really computed.
    live.nReused = m_session->reusable_prefix(prompt, opt);
    live.speculative = opt.draft ? QString::fromStdString(opt.draft->name()) : QString();
    live.kvCache = opt.use_kv_cache;
  }
  emit metricsUpdated(relay.live());  // prefill runs without callbacks: show it started
  m_shared->tokensGenerated.store(0);
  auto onToken = [&](const TokenEvent& e) { relay.onToken(e); };

  Result<GenerateResult> res = [&]() -> Result<GenerateResult> {
    if (!remote) return m_session->generate(prompt, opt, onToken, &m_shared->stop);
    // Stop sets m_shared->stop: the client closes the connection at the next
    // piece and the server cancels the sequence.
    auto r = notebook ? m_remote->complete(input.text, opt, onToken, &m_shared->stop)
                      : m_remote->chat(input.conversation(), opt, onToken, &m_shared->stop);
    if (!r) return r.status();
    return std::move(r->result);
  }();
  relay.flush();
  if (!res) return fail(QString::fromStdString(res.status().message()));
  relay.finish(res->metrics, msSince(t0));
  emit generationFinished(requestId, toStats(res->metrics, backendName));
}

DraftSource* EngineWorker::draftSource(const GenerationSettings& settings) {
  const auto mode = speculative_mode_from_string(settings.speculative.toStdString());
  if (mode == SpeculativeMode::prompt_lookup) {
    if (!m_lookup) m_lookup = make_prompt_lookup_draft();
    return m_lookup.get();
  }
  if (mode == SpeculativeMode::self_draft) return selfDraft(settings);
  if (mode != SpeculativeMode::draft_model) return nullptr;
  if (settings.draftModel.isEmpty()) {
    emit errorOccurred(tr("Speculative decoding with a draft model needs a draft model file (Settings); "
                          "answering without speculation."));
    return nullptr;
  }
  if (m_draft && m_draftPath == settings.draftModel) return m_draft.get();
  m_draft.reset();
  m_draftPath.clear();
  auto dm = Model::load(settings.draftModel.toStdString());
  if (!dm) {
    emit errorOccurred(tr("Draft model: %1; answering without speculation.").arg(QString::fromStdString(dm.status().message())));
    return nullptr;
  }
  // The draft runs on the fast CPU backend whatever the chat's.
  BackendOptions dbo = backend_options_from_environment();
  dbo.n_threads = defaultThreads();
  set_default_passes(&dbo, **dm);
  auto db = make_backend(*dm, dbo);
  if (!db) {
    emit errorOccurred(QString::fromStdString(db.status().message()));
    return nullptr;
  }
  auto src = make_draft_model_source(*dm, std::move(db->backend), m_session->n_ctx(), m_session->model());
  if (!src) {
    emit errorOccurred(tr("Draft model: %1; answering without speculation.").arg(QString::fromStdString(src.status().message())));
    return nullptr;
  }
  m_draft = std::move(*src);
  m_draftPath = settings.draftModel;
  return m_draft.get();
}

DraftSource* EngineWorker::selfDraft(const GenerationSettings& settings) {
  if (!m_session->backend().can_skip_layers()) {
    emit errorOccurred(tr("Self-speculation runs on the CPU backend only (the %1 backend cannot skip layers); "
                          "answering without speculation.")
                           .arg(QString::fromStdString(m_session->backend().name())));
    return nullptr;
  }
  if (m_self && m_selfSkip == settings.specSkip) return m_self.get();
  m_self.reset();
  const int n_layer = m_session->model().config().n_layer;
  const std::string spelling =
      settings.specSkip.isEmpty() ? default_self_skip(n_layer) : settings.specSkip.toStdString();
  auto skip = parse_layer_skip(spelling, n_layer);
  if (!skip) {
    emit errorOccurred(tr("Self-speculation: %1; answering without speculation.")
                           .arg(QString::fromStdString(skip.status().message())));
    return nullptr;
  }
  auto src = make_self_draft(m_session->shared_model(), SelfDraftOptions{std::move(*skip)});
  if (!src) {
    emit errorOccurred(QString::fromStdString(src.status().message()));
    return nullptr;
  }
  m_self = std::move(*src);
  m_selfSkip = settings.specSkip;
  return m_self.get();
}

}  // namespace phaselab::ui
