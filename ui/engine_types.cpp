#include "engine_types.h"

namespace phaselab::ui {

QJsonObject RequestStats::toJson() const {
  QJsonObject o;
  o["n_prompt"] = nPrompt;
  o["n_reused"] = nReused;
  o["n_generated"] = nGenerated;
  o["ttft_ms"] = ttftMs;
  o["prefill_ms"] = prefillMs;
  o["prefill_tps"] = prefillTps;
  o["decode_ms"] = decodeMs;
  o["decode_tps"] = decodeTps;
  o["kv_used"] = static_cast<qint64>(kvUsed);
  o["kv_capacity"] = static_cast<qint64>(kvCapacity);
  if (specDrafted > 0) {
    o["spec_drafted"] = specDrafted;
    o["spec_accepted"] = specAccepted;
    o["tokens_per_pass"] = tokensPerPass;
  }
  o["stop_reason"] = stopReason;
  o["backend"] = backend;
  if (!error.isEmpty()) o["error"] = error;
  return o;
}

RequestStats RequestStats::fromJson(const QJsonObject& o) {
  RequestStats s;
  s.nPrompt = o["n_prompt"].toInt();
  s.nReused = o["n_reused"].toInt();
  s.nGenerated = o["n_generated"].toInt();
  s.ttftMs = o["ttft_ms"].toDouble();
  s.prefillMs = o["prefill_ms"].toDouble();
  s.prefillTps = o["prefill_tps"].toDouble();
  s.decodeMs = o["decode_ms"].toDouble();
  s.decodeTps = o["decode_tps"].toDouble();
  s.kvUsed = static_cast<quint64>(o["kv_used"].toInteger());
  s.kvCapacity = static_cast<quint64>(o["kv_capacity"].toInteger());
  s.specDrafted = o["spec_drafted"].toInt();
  s.specAccepted = o["spec_accepted"].toInt();
  s.tokensPerPass = o["tokens_per_pass"].toDouble();
  s.stopReason = o["stop_reason"].toString();
  s.backend = o["backend"].toString();
  s.error = o["error"].toString();
  return s;
}

QString unbrokenName(const QString& name) {
  QString s = name;
  s.replace(QLatin1Char('-'), QChar(0x2011));  // NON-BREAKING HYPHEN
  return s;
}

QString RequestStats::summary() const {
  if (!error.isEmpty()) return QStringLiteral("failed: %1").arg(error);
  QString s = QStringLiteral("TTFT %1 ms · %2 tok/s · %3 in / %4 out · %5")
                  .arg(ttftMs, 0, 'f', ttftMs < 10 ? 1 : 0)
                  .arg(decodeTps, 0, 'f', 1)
                  .arg(nPrompt)
                  .arg(nGenerated)
                  .arg(unbrokenName(backend));
  if (nReused > 0) s += QStringLiteral(" · %1 reused").arg(nReused);
  if (specDrafted > 0)
    s += QStringLiteral(" · spec %1% accepted, %2 tok/pass")
             .arg(100.0 * specAccepted / specDrafted, 0, 'f', 0)
             .arg(tokensPerPass, 0, 'f', 2);
  if (stopReason == QLatin1String("cancelled")) s += QStringLiteral(" · stopped");
  else if (stopReason == QLatin1String("context_full")) s += QStringLiteral(" · context full");
  else if (stopReason == QLatin1String("length")) s += QStringLiteral(" · token limit");
  return s;
}

}  // namespace phaselab::ui
