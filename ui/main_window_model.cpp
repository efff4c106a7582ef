// MainWindow and the model: loading one (or connecting to a remote server),
// serving it over the OpenAI API, the Settings dialog that changes how, and
// the machine's peaks that the phase meter divides by.
#include <QApplication>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QPointer>
#include <QProgressDialog>
#include <QSettings>
#include <QStatusBar>
#include <QThread>
#include <QTimer>

#include "chat_session.h"
#include "engine_controller.h"
#include "hardware_probe.h"
#include "main_window.h"
#include "metrics_dock.h"
#include "model_manager.h"
#include "phase_meter.h"
#include "phaselab/backend.h"
#include "phaselab/log.h"
#include "settings_dialog.h"
#include "status_bar_labels.h"

namespace phaselab::ui {

void MainWindow::loadModel(const QString& path) {
  clearError();
  // Opening a local model is choosing it over a remote server, for the next
  // start too.
  if (m_settings.useRemote) {
    m_settings.useRemote = false;
    m_settings.save();
  }
  m_engine->loadModel(path, m_settings.engine);
}

void MainWindow::connectRemote(const RemoteConfig& remote) {
  clearError();
  m_engine->connectRemote(remote);
}

void MainWindow::setEngineConfig(const EngineConfig& e) { m_settings.engine = e; }

void MainWindow::onModelLoadStarted(const QString& path) {
  // A remote server's URL ends in its API path ("v1"): name the server.
  const bool url = path.contains(QLatin1String("://"));
  const QString what = url ? path : QFileInfo(path).fileName();
  m_statusLabels->setModelText(url ? tr("Connecting to %1…").arg(what) : tr("Loading %1…").arg(what));
  updateWelcome();
  if (!m_loadProgress) {
    // Busy indicator: the load is an mmap plus validation, with no
    // meaningful percentage. Shown only if it takes longer than 300 ms.
    m_loadProgress = new QProgressDialog(this);
    m_loadProgress->setWindowTitle(tr("Loading model"));
    m_loadProgress->setRange(0, 0);
    m_loadProgress->setMinimumDuration(300);
    m_loadProgress->setAutoClose(false);
    m_loadProgress->setAutoReset(false);
    connect(m_loadProgress, &QProgressDialog::canceled, m_engine, &EngineController::cancelLoad);
  }
  m_loadProgress->setLabelText(m_statusLabels->modelText());
  m_loadProgress->reset();
  m_loadProgress->setRange(0, 0);
  m_loadProgress->setValue(0);
}

void MainWindow::onModelLoaded(const ModelInfo& info) {
  if (m_loadProgress) m_loadProgress->cancel();
  if (info.remote) {
    spdlog::info("gui: connected to {} ({})", info.remoteUrl.toStdString(), info.remoteModel.toStdString());
    showModelHeader(info);
    m_metrics->setModel(info);
    updateBaseModelNote();
    syncChatToolbar();
    statusBar()->showMessage(tr("Connected to %1 at %2").arg(info.name, info.remoteUrl), 5000);
    applyServeSettings();  // says why it does not serve, if it is asked to
    updateWelcome();
    emit modelReady();
    return;
  }
  spdlog::info("gui: loaded model {} ({}, {} backend)", info.path.toStdString(), info.name.toStdString(),
               info.backend.toStdString());
  m_loadedConfig = info.config;
  showModelHeader(info);
  m_metrics->setModel(info);
  updateBaseModelNote();
  syncChatToolbar();
  // The phase meter divides by the peaks of the device doing the work: the
  // GPU's from its properties, else this machine's measured CPU peaks.
  if (info.backend == QLatin1String("cuda")) {
    const CudaProbe gpu = probe_cuda(backend_options_from_environment().cuda.library);
    HardwarePeaks peaks;
    peaks.memoryBandwidth = gpu.peak_gbps * 1e9;
    peaks.peakFlops = gpu.peak_tflops * 1e12;
    if (peaks.valid()) m_metrics->setPeaks(peaks);
  } else {
    m_metrics->setPeaks(HardwareProbe::cached());
    // A probe under way (or waiting for this load to end) is still what the meter awaits.
    if (m_probing || m_probeWaiting) m_metrics->phaseMeter()->setMeasuring(true);
  }
  if (m_options.rememberModel) {
    m_settings.lastModel = info.path;
    QSettings().setValue(QStringLiteral("model/last"), info.path);
  }
  statusBar()->showMessage(tr("Loaded %1 (%2 parameters, %3)")
                               .arg(info.name, ModelManager::formatParamsWithActive(info), info.typeMix),
                           5000);
  // The engine stopped the server of the previous model: serve this one.
  applyServeSettings();
  updateWelcome();
  emit modelReady();
}

void MainWindow::showModelHeader(const ModelInfo& info) {
  if (info.remote) {
    m_statusLabels->setModelText(tr("%1 · remote at %2").arg(info.name, info.remoteUrl));
    setWindowTitle(QStringLiteral("PhaseLab — %1 (remote)").arg(info.name));
  } else {
    m_statusLabels->setModelText(tr("%1 · %2 · %3").arg(info.name, info.backend, info.typeMix));
    setWindowTitle(QStringLiteral("PhaseLab — %1").arg(info.name));
  }
}

void MainWindow::onModelLoadEnded(bool cancelled) {
  if (m_loadProgress) m_loadProgress->cancel();
  if (m_engine->hasModel()) {
    // The model that was working is still loaded (a load builds the new one
    // before it lets the old one go): the window goes on showing it, and
    // settings that did not load are not kept.
    const ModelInfo& kept = m_engine->modelInfo();
    showModelHeader(kept);
    if (!kept.remote && m_settings.engine != kept.config) {
      m_settings.engine = kept.config;
      m_settings.save();
      statusBar()->showMessage(tr("The new engine settings were not applied: %1 keeps its own.").arg(kept.name), 8000);
    }
    syncChatToolbar();
    applyServeSettings();  // a model reloaded after a failed one is served again
  } else {
    m_statusLabels->setModelText(cancelled ? tr("No model (load cancelled)") : tr("No model"));
    setWindowTitle(QStringLiteral("PhaseLab"));
    syncChatToolbar();
  }
  updateWelcome();
  updateBaseModelNote();
}

void MainWindow::onServerStarted(const QString& url) {
  m_serveStatus = tr("Serving at %1").arg(url);
  m_statusLabels->showServing(m_serveStatus);
  statusBar()->showMessage(tr("The OpenAI API serves the loaded model at %1").arg(url), 8000);
}

void MainWindow::onServerStopped() {
  m_serveStatus = tr("Not serving.");
  m_statusLabels->hideServing();
}

void MainWindow::onServerFailed(const QString& error) {
  m_serveStatus = error;
  m_statusLabels->hideServing();
  showError(tr("The OpenAI API server did not start: %1").arg(error));
}

QString MainWindow::serveLabelText() const { return m_statusLabels->servingText(); }

void MainWindow::setServeSettings(bool serve, int port) {
  const bool changed = serve != m_settings.serve || port != m_settings.servePort;
  m_settings.serve = serve;
  m_settings.servePort = port;
  m_settings.save();
  if (changed || serve != m_engine->isServing()) applyServeSettings();
}

void MainWindow::applyServeSettings() {
  const bool local = m_engine->hasModel() && !m_engine->modelInfo().remote;
  if (m_settings.serve && local) {
    m_engine->startServer(m_settings.servePort);  // a running one is stopped first
  } else {
    if (m_engine->isServing())
      m_engine->stopServer();  // serverStopped says so
    else
      m_serveStatus = tr("Not serving.");  // not an earlier failure's message
    if (m_settings.serve && m_engine->hasModel())
      m_serveStatus = tr("Not serving: the chat is connected to a remote server; serving needs a local model.");
    else if (m_settings.serve)
      m_serveStatus = tr("Not serving yet: PhaseLab serves the model once one is loaded.");
  }
}

void MainWindow::openModelDialog() {
  // The dialog starts in the model folder, made if it does not exist yet.
  const QString dir = QString::fromStdString(user_model_dir());
  QDir().mkpath(dir);
  const QString path = QFileDialog::getOpenFileName(this, tr("Open a GGUF model"), dir,
                                                    tr("GGUF models (*.gguf);;All files (*)"));
  if (!path.isEmpty()) loadModel(path);
}

void MainWindow::openModelManager() {
  ModelManager dlg(QString::fromStdString(user_model_dir()), m_engine->modelInfo(), m_engine->hasModel(), this);
  connect(&dlg, &ModelManager::loadRequested, this, &MainWindow::loadModel);
  connect(&dlg, &ModelManager::unloadRequested, m_engine, &EngineController::unloadModel);
  dlg.exec();
}

void MainWindow::openSettings(bool serversPage) {
  // A remote server has no engine settings to reload for.
  const bool remoteLoaded = m_engine->hasModel() && m_engine->modelInfo().remote;
  const bool localLoaded = m_engine->hasModel() && !remoteLoaded;
  SettingsDialog dlg(m_settings, m_loadedConfig, localLoaded, this);
  if (localLoaded) dlg.setTrainedContext(m_engine->modelInfo().contextTrained);
  // The server's state, kept current while the dialog is open.
  dlg.setServeStatus(m_serveStatus);
  if (serversPage) dlg.showServersPage();
  for (auto signal : {&EngineController::serverStarted, &EngineController::serverFailed})
    connect(m_engine, signal, &dlg, [this, &dlg] { dlg.setServeStatus(m_serveStatus); });
  connect(m_engine, &EngineController::serverStopped, &dlg, [this, &dlg] { dlg.setServeStatus(m_serveStatus); });
  if (dlg.exec() != QDialog::Accepted) return;
  const bool reload = dlg.needsReload();
  const AppSettings before = m_settings;
  m_settings = dlg.settings();
  m_settings.save();
  m_chat->setGenerationSettings(m_settings.generation);
  syncChatToolbar();
  const RemoteConfig& r = m_settings.remote;
  const bool remoteChanged = r.url != before.remote.url || r.apiKey != before.remote.apiKey || r.model != before.remote.model;
  if (m_settings.useRemote && !r.url.isEmpty() && (!remoteLoaded || remoteChanged)) {
    connectRemote(r);  // the server is applied again once connected (onModelLoaded)
    return;
  }
  if (m_settings.useRemote && r.url.isEmpty()) {
    showError(tr("A remote server needs its URL (Settings > Servers), e.g. http://127.0.0.1:8000/v1."));
    return;
  }
  if (!m_settings.useRemote && remoteLoaded) {
    // Back to a local model: the last one, if there is one.
    if (!m_settings.lastModel.isEmpty() && QFileInfo::exists(m_settings.lastModel))
      loadModel(m_settings.lastModel);
    else
      m_engine->unloadModel();
    return;
  }
  if (reload) {
    loadModel(m_engine->modelInfo().path);  // serving resumes once it is loaded
    return;
  }
  if (!m_engine->hasModel() && !m_engine->isLoading() && m_settings.engine != before.engine &&
      !m_settings.lastModel.isEmpty() && QFileInfo::exists(m_settings.lastModel)) {
    // No model is loaded (an earlier load failed): new engine settings are
    // tried on the last model at once.
    loadModel(m_settings.lastModel);
    return;
  }
  if (m_settings.serve != before.serve || m_settings.servePort != before.servePort ||
      m_settings.serve != m_engine->isServing())
    applyServeSettings();
}

void MainWindow::setUpHardwarePeaks(bool measureHardware) {
  connect(m_metrics, &MetricsDock::remeasureRequested, this, &MainWindow::startHardwareProbe);
  // Cached peaks that were doubtful when measured are shown with their
  // reason but never divided by (the meter shows no percentage), and the
  // machine is measured again once the engine is idle.
  const HardwarePeaks cachedPeaks = HardwareProbe::cached();
  m_metrics->setPeaks(cachedPeaks);
  // The first probe waits for the window to settle: a model loading at the
  // same time (page faults on 240 MB of weights) halved the figure.
  if (!cachedPeaks.usable() && measureHardware) QTimer::singleShot(1000, this, &MainWindow::startHardwareProbe);
}

void MainWindow::setMachinePeaks(const HardwarePeaks& peaks) {
  // One figure for the whole window: the meter, the next batch sweep (it
  // reads the cache) and the next start all divide by what was measured last.
  HardwareProbe::store(peaks);
  // A GPU model keeps the GPU's peaks; the CPU's are stored for later.
  if (!m_engine->hasModel() || m_engine->modelInfo().backend != QLatin1String("cuda")) {
    m_metrics->setPeaks(peaks);
    if (m_probing || m_probeWaiting) m_metrics->phaseMeter()->setMeasuring(true);  // the window's own probe is still to come
  }
}

void MainWindow::startHardwareProbe() {
  if (m_probing) return;
  if (m_engine->isBusy() || m_engine->isLoading()) {
    // A load or an answer would share the cores and the memory bus with the
    // probe and lower every figure: measure once the engine is idle.
    m_metrics->phaseMeter()->setMeasuring(true);
    statusBar()->showMessage(tr("The machine will be measured once the engine is idle."), 5000);
    m_probeWaiting = true;
    if (!m_probeRetryConnected) {
      m_probeRetryConnected = true;
      auto retry = [this] {
        if (!m_probeWaiting || m_engine->isBusy() || m_engine->isLoading()) return;
        m_probeWaiting = false;
        QTimer::singleShot(300, this, &MainWindow::startHardwareProbe);
      };
      connect(m_engine, &EngineController::busyChanged, this, retry);
      connect(m_engine, &EngineController::modelLoaded, this, retry);
      connect(m_engine, &EngineController::modelLoadFailed, this, retry);
      connect(m_engine, &EngineController::modelLoadCancelled, this, retry);
    }
    return;
  }
  m_probing = true;
  m_metrics->phaseMeter()->setMeasuring(true);
  statusBar()->showMessage(tr("Measuring this machine's memory bandwidth and compute peaks…"));
  QPointer<MainWindow> self(this);
  QThread* t = QThread::create([self] {
    const HardwarePeaks peaks = HardwareProbe::measure();
    QMetaObject::invokeMethod(qApp, [self, peaks] {
      if (!self) {
        HardwareProbe::store(peaks);
        return;
      }
      self->m_probing = false;
      self->m_metrics->phaseMeter()->setMeasuring(false);
      self->setMachinePeaks(peaks);
      self->statusBar()->showMessage(
          tr("Measured: memory reads %1 GB/s on %n thread(s)", "", peaks.threads).arg(peaks.memoryBandwidth / 1e9, 0, 'f', 1),
          8000);
    }, Qt::QueuedConnection);
  });
  connect(t, &QThread::finished, t, &QObject::deleteLater);
  t->start(QThread::LowPriority);
}

}  // namespace phaselab::ui
