// Shared set-up of the GUI tests: isolated settings, data and database
// folders, so a test never touches the user's files and never runs the
// hardware probe.
#pragma once

#include <QCoreApplication>
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "hardware_probe.h"
#include "main_window.h"

namespace phaselab::ui::testing {

inline QString stories() { return QStringLiteral(PHASELAB_TEST_DATA "/stories260K.gguf"); }

// Call from initTestCase(); keep the QTemporaryDir alive for the whole test.
inline void isolate(QTemporaryDir& dir, const char* appName) {
  QVERIFY(dir.isValid());
  qputenv("XDG_CONFIG_HOME", dir.filePath(QStringLiteral("config")).toUtf8());
  qputenv("XDG_DATA_HOME", dir.filePath(QStringLiteral("data")).toUtf8());
  qputenv("XDG_CACHE_HOME", dir.filePath(QStringLiteral("cache")).toUtf8());  // quantized variants of Compare
  qputenv("PHASELAB_MODEL_DIR", dir.filePath(QStringLiteral("models")).toUtf8());
  QSettings::setPath(QSettings::NativeFormat, QSettings::UserScope, dir.filePath(QStringLiteral("config")));
  QCoreApplication::setOrganizationName(QStringLiteral("PhaseLabTest"));
  QCoreApplication::setApplicationName(QString::fromLatin1(appName));
  // Fixed peaks: the phase meter has something to divide by, no probe runs.
  HardwarePeaks peaks;
  peaks.memoryBandwidth = 20e9;
  peaks.peakFlops = 100e9;
  peaks.threads = 2;
  HardwareProbe::store(peaks);
}

// A main window on the database at dbPath that neither runs the hardware
// probe nor reloads the previous session's model.
inline MainWindow::Options windowOptions(const QString& dbPath) {
  MainWindow::Options o;
  o.dbPath = dbPath;
  o.measureHardware = false;
  o.autoLoadLastModel = false;
  return o;
}

// The stories model loaded into the window on one engine thread (one core
// for the engine, one for the GUI thread), c's other settings kept;
// whether it became ready.
inline bool loadStories(MainWindow& w, EngineConfig c = EngineConfig{}) {
  QSignalSpy ready(&w, &MainWindow::modelReady);
  c.threads = 1;
  w.setEngineConfig(c);
  w.loadModel(stories());
  return ready.wait(20000);
}

}  // namespace phaselab::ui::testing
