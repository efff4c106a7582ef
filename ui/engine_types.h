// Plain value types that cross the GUI <-> engine thread boundary. They are
// copied into queued signals, so they hold no pointers into engine state.
#pragma once

#include <QList>
#include <QMetaType>
#include <QString>
#include <QJsonObject>

#include "phaselab/metrics.h"
#include "phaselab/speculative.h"

namespace phaselab::ui {

using phaselab::Phase;  // a request's phase, as the engine names it (to_string: prefill | decode | done)

// What a model load needs; a change of any of these needs a reload.
struct EngineConfig {
  QString backend = QStringLiteral("cpu");  // cpu | cpu-portable | cpu-reference | cuda
  int threads = 0;                           // 0: one per physical core (phaselab::default_thread_count)
  int contextSize = 0;                       // 0: the model's, at most 4096
  QString kvType = QStringLiteral("f16");    // how K and V are stored: f16 | bf16 | f32 | q8_0 (phaselab::kv_type_name)
  bool operator==(const EngineConfig&) const = default;
};

// A remote OpenAI-compatible server to chat with instead of a local model
// (PhaseLab's own, vLLM, SGLang, llama-server, Dynamo).
struct RemoteConfig {
  QString url;     // the API's base, e.g. http://127.0.0.1:8080/v1
  QString apiKey;  // empty: none
  QString model;   // empty: the first the server lists
};

// Per request; changes apply to the next answer without a reload.
struct GenerationSettings {
  float temperature = 0.8f;
  int topK = 40;
  float topP = 0.95f;
  float minP = 0.05f;
  float repeatPenalty = 1.0f;
  quint64 seed = 0;  // 0: a fresh random seed per request
  int maxTokens = 512;
  bool useKvCache = true;
  bool prefixCache = true;  // reuse cached KV blocks of earlier turns and conversations
  // none | lookup | draft | self: a phaselab::SpeculativeMode's to_string
  QString speculative = QString::fromLatin1(to_string(SpeculativeMode::off));
  int specK = 4;            // tokens drafted per target pass
  QString draftModel;       // GGUF path for speculative = draft
  QString specSkip;         // speculative = self: the layers skipped ("9-15"); empty: default_self_skip
  bool ignoreEos = false;  // only for tests and demos that need long answers
  QString systemPrompt;
  // chat: the turns through a chat template. notebook: the model continues
  // the messages' text joined as written, with no template (base models).
  QString mode = QStringLiteral("chat");
  QString chatTemplate;  // a phaselab::chat_template_family_name(); empty: the model's own
};

struct ChatTurn {
  QString role;  // system | user | assistant
  QString content;
};

struct ModelInfo {
  QString path;
  QString name;
  QString architecture;
  qint64 nParams = 0;
  qint64 nParamsActive = 0;  // a mixture of experts' parameters per token (= nParams for a dense model)
  int experts = 0, expertsUsed = 0;  // a mixture of experts: per layer, and per token (0: dense)
  QString typeMix;
  int contextTrained = 0;
  int contextSize = 0;  // of the session actually created
  QString kvType;       // its KV cache's storage: f16 | f32
  quint64 kvBytes = 0;  // the KV pool's K and V
  int kvBlocks = 0;     // the KV pool's blocks (of KvPool::kBlockTokens positions), all free after a load
  QString kvWindowNote;  // "15 of 18 layers keep only their 512-position window", or empty
  qint64 fileSize = 0;
  quint64 weightBytes = 0;  // read per decoded token
  // Multiply-add work of one prompt token, counted as 2 operations each: the
  // layers' weight matrices (the token embedding is a lookup, and the output
  // projection runs for the last token only).
  double prefillOpsPerToken = 0;
  int maxBatch = 0;  // tokens per forward pass at most: a longer prompt is prefilled in several passes
  QString chatTemplate;      // the family chat uses (plain-fewshot for a base model)
  bool hasChatTemplate = false;  // false: a base model, best used in notebook mode
  QString backend;
  int threads = 0;
  EngineConfig config;  // what it was loaded with (Settings tells a reload by it)
  // A remote server (RemoteConfig): path is its URL, name its model; what
  // only the server knows (parameters, context, KV, weights) stays 0 / empty,
  // and architecture, typeMix and backend say "remote".
  bool remote = false;
  QString remoteUrl;
  QString remoteModel;
};

// A snapshot while a request runs (a few per second) and one at its end.
struct LiveMetrics {
  int requestId = 0;
  Phase phase = Phase::prefill;
  int nPrompt = 0;
  int nReused = 0;
  int nGenerated = 0;
  double ttftMs = 0;
  double prefillMs = 0;
  double prefillTps = 0;
  double elapsedMs = 0;     // since the request was submitted
  double decodeTps = 0;     // average since the first token
  double windowTps = 0;     // over the interval since the previous snapshot
  quint64 kvUsed = 0, kvCapacity = 0;
  // Speculative decoding so far in this request (drafted 0: off); the
  // acceptance (accepted / drafted) is the engine's RequestMetrics::spec_acceptance.
  int specDrafted = 0, specAccepted = 0;
  double specAcceptance = 0;
  double tokensPerPass = 0;
  QString speculative;  // the draft source's name, empty when off
  // False when the request runs without the KV cache: every step recomputes
  // all positions, so decode is compute-bound, not memory-bound.
  bool kvCache = true;
  // Paged KV pool (at the end of the request).
  int kvBlocksUsed = 0, kvBlocksCached = 0, kvBlocksShared = 0, kvBlocksTotal = 0;
  // A remote server answered: the figures are measured here, on the client
  // (TTFT includes the network; no prefill, KV or device figures exist).
  bool remote = false;
};

// A name shown in wrapped text that must stay on one line: its hyphens
// become non-breaking ones ("cpu-avx512-vnni" was wrapped as "cpu-" /
// "avx512-vnni").
QString unbrokenName(const QString& name);

// Final numbers of one answer, shown under it and stored with it.
struct RequestStats {
  int nPrompt = 0;
  int nReused = 0;
  int nGenerated = 0;
  double ttftMs = 0;
  double prefillMs = 0;
  double prefillTps = 0;
  double decodeMs = 0;
  double decodeTps = 0;
  quint64 kvUsed = 0, kvCapacity = 0;
  int specDrafted = 0, specAccepted = 0;
  double tokensPerPass = 0;
  QString stopReason;  // eos | stop_string | length | cancelled | context_full | error
  QString backend;
  QString error;       // non-empty when the request failed

  QJsonObject toJson() const;
  static RequestStats fromJson(const QJsonObject& o);
  // "TTFT 12 ms · 35.2 tok/s · 14 in / 120 out · cpu-avx2"
  QString summary() const;
};

}  // namespace phaselab::ui

Q_DECLARE_METATYPE(phaselab::ui::EngineConfig)
Q_DECLARE_METATYPE(phaselab::ui::RemoteConfig)
Q_DECLARE_METATYPE(phaselab::ui::GenerationSettings)
Q_DECLARE_METATYPE(phaselab::ui::ChatTurn)
Q_DECLARE_METATYPE(phaselab::ui::ModelInfo)
Q_DECLARE_METATYPE(phaselab::ui::LiveMetrics)
Q_DECLARE_METATYPE(phaselab::ui::RequestStats)
