// AppSettings: the user's engine and sampling choices, kept in QSettings.
#pragma once

#include <QString>

#include "engine_types.h"

namespace phaselab::ui {

struct AppSettings {
  EngineConfig engine;
  GenerationSettings generation;
  QString lastModel;
  // The OpenAI-compatible server for the loaded model (127.0.0.1 only);
  // applied again after each model load.
  bool serve = false;
  int servePort = 8080;  // 0: any free port
  // Chat with a remote OpenAI-compatible server instead of a local model.
  bool useRemote = false;
  RemoteConfig remote;

  static AppSettings load();
  void save() const;
};

}  // namespace phaselab::ui
