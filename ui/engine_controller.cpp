#include "engine_controller.h"

#include "engine_worker.h"

namespace phaselab::ui {

namespace {
void registerTypes() {
  qRegisterMetaType<EngineConfig>();
  qRegisterMetaType<RemoteConfig>();
  qRegisterMetaType<GenerationSettings>();
  qRegisterMetaType<ChatTurn>();
  qRegisterMetaType<QList<ChatTurn>>();
  qRegisterMetaType<ModelInfo>();
  qRegisterMetaType<LiveMetrics>();
  qRegisterMetaType<RequestStats>();
}
}  // namespace

EngineController::EngineController(QObject* parent) : QObject(parent), m_shared(std::make_shared<EngineShared>()) {
  registerTypes();
  m_thread.setObjectName(QStringLiteral("phaselab-engine"));
  m_worker = new EngineWorker(m_shared);
  m_worker->moveToThread(&m_thread);
  connect(&m_thread, &QThread::finished, m_worker, &QObject::deleteLater);

  // Every connection across the thread boundary is queued explicitly, so a
  // refactor that moves an object cannot silently make a call direct.
  constexpr auto Q = Qt::QueuedConnection;
  connect(this, &EngineController::loadRequested, m_worker, &EngineWorker::loadModel, Q);
  connect(this, &EngineController::unloadRequested, m_worker, &EngineWorker::unloadModel, Q);
  connect(this, &EngineController::generateRequested, m_worker, &EngineWorker::generate, Q);
  connect(this, &EngineController::remoteConnectRequested, m_worker, &EngineWorker::connectRemote, Q);
  connect(this, &EngineController::serverStartRequested, m_worker, &EngineWorker::startServer, Q);
  connect(this, &EngineController::serverStopRequested, m_worker, &EngineWorker::stopServer, Q);
  connect(m_worker, &EngineWorker::serverStarted, this, [this](const QString& url) {
    m_serverUrl = url;
    emit serverStarted(url);
  }, Q);
  connect(m_worker, &EngineWorker::serverStopped, this, [this] {
    m_serverUrl.clear();
    emit serverStopped();
  }, Q);
  connect(m_worker, &EngineWorker::serverFailed, this, [this](const QString& e) {
    m_serverUrl.clear();
    emit serverFailed(e);
  }, Q);

  connect(m_worker, &EngineWorker::modelLoaded, this, &EngineController::onModelLoaded, Q);
  // A failed or cancelled load leaves what was loaded before it (kept).
  auto keep = [this](const ModelInfo& kept) {
    m_loading = false;
    m_hasModel = !kept.path.isEmpty();
    m_modelInfo = kept;
  };
  connect(m_worker, &EngineWorker::modelLoadFailed, this, [this, keep](const QString& e, const ModelInfo& kept) {
    keep(kept);
    emit modelLoadFailed(e);
    emit errorOccurred(m_hasModel ? QStringLiteral("Could not load the model: %1. %2 is still loaded.").arg(e, kept.name)
                                  : QStringLiteral("Could not load the model: %1").arg(e));
  }, Q);
  connect(m_worker, &EngineWorker::modelLoadCancelled, this, [this, keep](const ModelInfo& kept) {
    keep(kept);
    emit modelLoadCancelled();
  }, Q);
  connect(m_worker, &EngineWorker::modelUnloaded, this, [this] {
    m_hasModel = false;
    m_modelInfo = {};
    emit modelUnloaded();
  }, Q);
  connect(m_worker, &EngineWorker::tokensReady, this, &EngineController::tokensReady, Q);
  connect(m_worker, &EngineWorker::reasoningReady, this, &EngineController::reasoningReady, Q);
  connect(m_worker, &EngineWorker::metricsUpdated, this, &EngineController::metricsUpdated, Q);
  connect(m_worker, &EngineWorker::generationFinished, this, &EngineController::onGenerationFinished, Q);
  connect(m_worker, &EngineWorker::errorOccurred, this, &EngineController::errorOccurred, Q);
  m_thread.start();
}

EngineController::~EngineController() {
  // The only place the GUI thread waits for the engine: at most one decode
  // step (or a model load) after stop is set.
  m_shared->stop.store(true);
  m_shared->loadCancel.store(true);
  m_thread.quit();
  m_thread.wait();
}

void EngineController::loadModel(const QString& path, const EngineConfig& config) {
  if (isBusy()) stop();
  m_shared->loadCancel.store(false);
  m_loading = true;
  m_hasModel = false;
  emit modelLoadStarted(path);
  emit loadRequested(path, config);
}

void EngineController::connectRemote(const RemoteConfig& remote) {
  if (isBusy()) stop();
  m_shared->loadCancel.store(false);
  m_loading = true;
  m_hasModel = false;
  emit modelLoadStarted(remote.url);
  emit remoteConnectRequested(remote);
}

void EngineController::startServer(int port) { emit serverStartRequested(port); }

void EngineController::stopServer() { emit serverStopRequested(); }

void EngineController::cancelLoad() {
  if (!m_loading) return;
  m_shared->loadCancel.store(true);
}

void EngineController::unloadModel() {
  if (isBusy()) stop();
  emit unloadRequested();
}

int EngineController::send(const QList<ChatTurn>& turns, const GenerationSettings& settings) {
  if (isBusy() || m_loading || !m_hasModel) return 0;
  m_shared->stop.store(false);
  m_shared->tokensGenerated.store(0);
  m_activeRequest = m_nextRequest++;
  emit busyChanged(true);
  emit generateRequested(m_activeRequest, turns, settings);
  return m_activeRequest;
}

void EngineController::stop() { m_shared->stop.store(true); }

void EngineController::onModelLoaded(const ModelInfo& info) {
  m_loading = false;
  m_hasModel = true;
  m_modelInfo = info;
  emit modelLoaded(info);
}

void EngineController::onGenerationFinished(int requestId, const RequestStats& stats) {
  if (requestId == m_activeRequest) {
    m_activeRequest = 0;
    emit generationFinished(requestId, stats);
    emit busyChanged(false);
  } else {
    emit generationFinished(requestId, stats);
  }
}

}  // namespace phaselab::ui
