// AppSettings: the user's engine and sampling choices, kept in QSettings.
#pragma once

#include <QString>

#include "engine_types.h"

namespace phaselab::ui {

struct AppSettings {
  EngineConfig engine;
  GenerationSettings generation;
  QString lastModel;

  static AppSettings load();
  void save() const;
};

}  // namespace phaselab::ui
