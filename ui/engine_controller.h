// EngineController: the GUI side of the engine. Owns the engine thread and
// its EngineWorker, talks to it only through queued signals, and never waits
// on it (except in the destructor, after asking it to stop).
#pragma once

#include <QList>
#include <QObject>
#include <QThread>
#include <atomic>
#include <memory>

#include "engine_types.h"

namespace phaselab::ui {

class EngineWorker;

// Written by the GUI thread, read by the engine between steps.
struct EngineShared {
  std::atomic<bool> stop{false};
  std::atomic<bool> loadCancel{false};
  std::atomic<int> tokensGenerated{0};  // of the running request, for tests and the UI
};

class EngineController : public QObject {
  Q_OBJECT
 public:
  explicit EngineController(QObject* parent = nullptr);
  ~EngineController() override;

  void loadModel(const QString& path, const EngineConfig& config);
  // Chat with a remote OpenAI-compatible server instead of a local model; the
  // same signals as a load (modelLoadStarted with the URL, modelLoaded with
  // info.remote, or modelLoadFailed).
  void connectRemote(const RemoteConfig& remote);
  void cancelLoad();
  void unloadModel();
  // Returns the request id, or 0 when the request was refused (busy or no model).
  int send(const QList<ChatTurn>& turns, const GenerationSettings& settings);
  void stop();
  // The OpenAI-compatible server for the loaded model, on 127.0.0.1 (port 0:
  // any free one): serverStarted(url) or serverFailed(error). The engine
  // stops it when the model is unloaded or another one loads (serverStopped).
  void startServer(int port);
  void stopServer();
  bool isServing() const { return !m_serverUrl.isEmpty(); }
  QString serverUrl() const { return m_serverUrl; }  // empty when not serving

  bool isBusy() const { return m_activeRequest != 0; }
  bool isLoading() const { return m_loading; }
  // False while a load runs; after a failed or cancelled one, true again
  // when the model that was working is still loaded (modelInfo() is its).
  bool hasModel() const { return m_hasModel; }
  int activeRequest() const { return m_activeRequest; }
  const ModelInfo& modelInfo() const { return m_modelInfo; }
  int tokensGenerated() const { return m_shared->tokensGenerated.load(); }

 signals:
  void modelLoadStarted(const QString& path);
  void modelLoaded(const phaselab::ui::ModelInfo& info);
  void modelLoadFailed(const QString& error);
  void modelLoadCancelled();
  void modelUnloaded();
  void tokensReady(int requestId, const QString& delta, int nTokens);
  void reasoningReady(int requestId, const QString& delta);  // a reasoning model's reasoning
  void metricsUpdated(const phaselab::ui::LiveMetrics& metrics);
  void generationFinished(int requestId, const phaselab::ui::RequestStats& stats);
  void errorOccurred(const QString& message);
  void busyChanged(bool busy);
  void serverStarted(const QString& url);
  void serverStopped();
  void serverFailed(const QString& error);

  // To the worker (queued).
  void loadRequested(const QString& path, const phaselab::ui::EngineConfig& config);
  void remoteConnectRequested(const phaselab::ui::RemoteConfig& remote);
  void serverStartRequested(int port);
  void serverStopRequested();
  void unloadRequested();
  void generateRequested(int requestId, const QList<phaselab::ui::ChatTurn>& turns,
                         const phaselab::ui::GenerationSettings& settings);

 private:
  void onModelLoaded(const ModelInfo& info);
  void onGenerationFinished(int requestId, const RequestStats& stats);

  std::shared_ptr<EngineShared> m_shared;
  QThread m_thread;
  EngineWorker* m_worker = nullptr;  // lives on m_thread, deleted when it finishes
  ModelInfo m_modelInfo;
  bool m_hasModel = false;
  bool m_loading = false;
  int m_activeRequest = 0;
  int m_nextRequest = 1;
  QString m_serverUrl;
};

}  // namespace phaselab::ui
