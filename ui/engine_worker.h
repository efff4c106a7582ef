// EngineWorker: lives on the engine thread and owns the model and session.
// Every slot catches everything: no exception may cross into Qt's event loop
// of another thread. Token text is coalesced here, so the GUI receives at
// most one delta per ~16 ms however fast the engine runs.
#pragma once

#include <QObject>
#include <atomic>
#include <memory>

#include "engine_types.h"

namespace phaselab {
class Model;
class Session;
class DraftSource;
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
  void generate(int requestId, const QList<phaselab::ui::ChatTurn>& turns,
                const phaselab::ui::GenerationSettings& settings);

 signals:
  void modelLoaded(const phaselab::ui::ModelInfo& info);
  void modelLoadFailed(const QString& error);
  void modelLoadCancelled();
  void modelUnloaded();
  // delta: the text released since the previous delta (whole UTF-8 characters);
  // nTokens: tokens generated so far in this request.
  void tokensReady(int requestId, const QString& delta, int nTokens);
  void metricsUpdated(const phaselab::ui::LiveMetrics& metrics);
  void generationFinished(int requestId, const phaselab::ui::RequestStats& stats);
  void errorOccurred(const QString& message);

 private:
  void loadModelImpl(const QString& path, const EngineConfig& config);
  void generateImpl(int requestId, const QList<ChatTurn>& turns, const GenerationSettings& settings);

  std::shared_ptr<EngineShared> m_shared;
  std::shared_ptr<Model> m_model;
  std::unique_ptr<Session> m_session;
  // Speculative decoding: the source for the settings (null: off); a draft
  // model is loaded once per path and target.
  DraftSource* draftSource(const GenerationSettings& settings);
  std::unique_ptr<DraftSource> m_lookup;
  std::unique_ptr<DraftSource> m_draft;
  QString m_draftPath;
};

}  // namespace phaselab::ui
