#include "app_settings.h"

#include <QSettings>
#include <algorithm>

namespace phaselab::ui {

AppSettings AppSettings::load() {
  QSettings s;
  AppSettings a;
  const GenerationSettings d;
  a.engine.backend = s.value(QStringLiteral("engine/backend"), a.engine.backend).toString();
  a.engine.threads = s.value(QStringLiteral("engine/threads"), a.engine.threads).toInt();
  a.engine.contextSize = s.value(QStringLiteral("engine/contextSize"), a.engine.contextSize).toInt();
  a.engine.kvType = s.value(QStringLiteral("engine/kvType"), a.engine.kvType).toString();
  GenerationSettings& g = a.generation;
  g.temperature = s.value(QStringLiteral("sampling/temperature"), d.temperature).toFloat();
  g.topK = s.value(QStringLiteral("sampling/topK"), d.topK).toInt();
  g.topP = s.value(QStringLiteral("sampling/topP"), d.topP).toFloat();
  g.minP = s.value(QStringLiteral("sampling/minP"), d.minP).toFloat();
  g.repeatPenalty = s.value(QStringLiteral("sampling/repeatPenalty"), d.repeatPenalty).toFloat();
  g.seed = s.value(QStringLiteral("sampling/seed"), d.seed).toULongLong();
  g.maxTokens = s.value(QStringLiteral("sampling/maxTokens"), d.maxTokens).toInt();
  g.useKvCache = s.value(QStringLiteral("engine/kvCache"), d.useKvCache).toBool();
  g.prefixCache = s.value(QStringLiteral("engine/prefixCache"), d.prefixCache).toBool();
  g.speculative = s.value(QStringLiteral("speculative/mode"), d.speculative).toString();
  g.specK = s.value(QStringLiteral("speculative/k"), d.specK).toInt();
  g.draftModel = s.value(QStringLiteral("speculative/draftModel"), d.draftModel).toString();
  g.specSkip = s.value(QStringLiteral("speculative/skipLayers"), d.specSkip).toString();
  g.systemPrompt = s.value(QStringLiteral("chat/systemPrompt"), d.systemPrompt).toString();
  a.lastModel = s.value(QStringLiteral("model/last")).toString();
  a.serve = s.value(QStringLiteral("serve/enabled"), false).toBool();
  a.servePort = std::clamp(s.value(QStringLiteral("serve/port"), 8080).toInt(), 0, 65535);
  a.useRemote = s.value(QStringLiteral("remote/use"), false).toBool();
  a.remote.url = s.value(QStringLiteral("remote/url")).toString();
  a.remote.apiKey = s.value(QStringLiteral("remote/apiKey")).toString();
  a.remote.model = s.value(QStringLiteral("remote/model")).toString();
  return a;
}

void AppSettings::save() const {
  QSettings s;
  s.setValue(QStringLiteral("engine/backend"), engine.backend);
  s.setValue(QStringLiteral("engine/threads"), engine.threads);
  s.setValue(QStringLiteral("engine/contextSize"), engine.contextSize);
  s.setValue(QStringLiteral("engine/kvType"), engine.kvType);
  s.setValue(QStringLiteral("sampling/temperature"), generation.temperature);
  s.setValue(QStringLiteral("sampling/topK"), generation.topK);
  s.setValue(QStringLiteral("sampling/topP"), generation.topP);
  s.setValue(QStringLiteral("sampling/minP"), generation.minP);
  s.setValue(QStringLiteral("sampling/repeatPenalty"), generation.repeatPenalty);
  s.setValue(QStringLiteral("sampling/seed"), generation.seed);
  s.setValue(QStringLiteral("sampling/maxTokens"), generation.maxTokens);
  s.setValue(QStringLiteral("engine/kvCache"), generation.useKvCache);
  s.setValue(QStringLiteral("engine/prefixCache"), generation.prefixCache);
  s.setValue(QStringLiteral("speculative/mode"), generation.speculative);
  s.setValue(QStringLiteral("speculative/k"), generation.specK);
  s.setValue(QStringLiteral("speculative/draftModel"), generation.draftModel);
  s.setValue(QStringLiteral("speculative/skipLayers"), generation.specSkip);
  s.setValue(QStringLiteral("chat/systemPrompt"), generation.systemPrompt);
  s.setValue(QStringLiteral("model/last"), lastModel);
  s.setValue(QStringLiteral("serve/enabled"), serve);
  s.setValue(QStringLiteral("serve/port"), servePort);
  s.setValue(QStringLiteral("remote/use"), useRemote);
  s.setValue(QStringLiteral("remote/url"), remote.url);
  // The key sits in the settings file in plain text, as the other settings
  // do (Settings says so beside the field); an empty one is not written.
  if (remote.apiKey.isEmpty())
    s.remove(QStringLiteral("remote/apiKey"));
  else
    s.setValue(QStringLiteral("remote/apiKey"), remote.apiKey);
  s.setValue(QStringLiteral("remote/model"), remote.model);
}

}  // namespace phaselab::ui
