// EngineWorker: lives on the engine thread and owns the model and session.
// Every slot catches everything: no exception may cross into Qt's event loop
// of another thread. Token text is coalesced here, so the GUI receives at
// most one delta per ~16 ms however fast the engine runs.
//
// Two more things live here. The OpenAI-compatible server (serve the loaded
// model to other programs on 127.0.0.1): its own backend and KV pool over the
// same weights, stepped by its own threads, stopped whenever the model goes.
// And a remote endpoint: instead of a model, a RemoteClient that the chat
// streams from, with client-side metrics only.
#pragma once

#include <QObject>
#include <atomic>
#include <memory>

#include "engine_types.h"
#include "phaselab/status.h"

namespace phaselab {
class Model;
class Session;
class DraftSource;
class OpenAiServer;
class RemoteClient;
}  // namespace phaselab

namespace phaselab::ui {

struct EngineShared;  // flags shared with EngineController (engine_controller.h)

class EngineWorker : public QObject {
  Q_OBJECT
 public:
  static constexpr int kDeltaIntervalMs = 16;
  static constexpr int kMetricsIntervalMs = 100;  // ~10 Hz: smooth charts, negligible cost

  explicit EngineWorker(std::shared_ptr<EngineShared> shared, QObject* parent = nullptr);
  ~EngineWorker() override;

 public slots:
  void loadModel(const QString& path, const phaselab::ui::EngineConfig& config);
  void unloadModel();
  // Chat with a remote OpenAI-compatible server instead of a local model:
  // modelLoaded (info.remote) or modelLoadFailed, as a load.
  void connectRemote(const phaselab::ui::RemoteConfig& remote);
  void generate(int requestId, const QList<phaselab::ui::ChatTurn>& turns,
                const phaselab::ui::GenerationSettings& settings);
  // Serves the loaded model at http://127.0.0.1:PORT/v1 (port 0: any free
  // one): serverStarted or serverFailed. A running server is stopped first.
  void startServer(int port);
  void stopServer();

 signals:
  void modelLoaded(const phaselab::ui::ModelInfo& info);
  // kept: what is loaded after the failure (the model that was working: a
  // load builds the new one before it lets the old one go); empty path: none.
  void modelLoadFailed(const QString& error, const phaselab::ui::ModelInfo& kept);
  void modelLoadCancelled(const phaselab::ui::ModelInfo& kept);
  void modelUnloaded();
  // delta: the text released since the previous delta (whole UTF-8 characters);
  // nTokens: tokens generated so far in this request.
  void tokensReady(int requestId, const QString& delta, int nTokens);
  // A reasoning model's reasoning (gpt-oss's analysis channel, a <think>
  // block), outside the answer's text.
  void reasoningReady(int requestId, const QString& delta);
  void metricsUpdated(const phaselab::ui::LiveMetrics& metrics);
  void generationFinished(int requestId, const phaselab::ui::RequestStats& stats);
  void errorOccurred(const QString& message);
  void serverStarted(const QString& url);  // the API's base, http://127.0.0.1:PORT/v1
  void serverStopped();
  void serverFailed(const QString& error);

 private:
  void loadModelImpl(const QString& path, const EngineConfig& config);
  struct Built;
  // Loads the model and makes its backend and session, touching nothing
  // installed: cancelled when the load is, every failure as a Status.
  Result<Built> build(const QString& path, const EngineConfig& config) const;
  void install(const QString& path, const EngineConfig& config, Built built);
  ModelInfo describe() const;  // of the installed model and session
  ModelInfo current() const;   // the installed model, the remote server, or empty
  void connectRemoteImpl(const RemoteConfig& remote);
  void generateImpl(int requestId, const QList<ChatTurn>& turns, const GenerationSettings& settings);
  class StreamRelay;  // the engine's token events -> tokensReady / metricsUpdated, coalesced
  void startServerImpl(int port);
  // Stops the server if one runs (serverStopped); whatever the model does next.
  void stopServerImpl();
  // The model, the session, the remote client and the server all go.
  void releaseModel();

  std::shared_ptr<EngineShared> m_shared;
  std::shared_ptr<Model> m_model;
  std::unique_ptr<Session> m_session;
  QString m_path;          // the loaded model's file
  EngineConfig m_config;  // the loaded model's (the server's backend is made the same way)
  int m_threads = 0;
  std::unique_ptr<RemoteClient> m_remote;  // set instead of m_model/m_session in remote mode
  // After m_model: it goes first (it holds the model too, through its scheduler).
  std::unique_ptr<OpenAiServer> m_server;
  // Speculative decoding: the source for the settings (null: off); a draft
  // model is loaded once per path and target.
  DraftSource* draftSource(const GenerationSettings& settings);
  DraftSource* selfDraft(const GenerationSettings& settings);
  std::unique_ptr<DraftSource> m_lookup;
  std::unique_ptr<DraftSource> m_draft;
  QString m_draftPath;
  std::unique_ptr<DraftSource> m_self;  // self-speculation for m_model, skipping m_selfSkip
  QString m_selfSkip;
};

}  // namespace phaselab::ui
