// BatchSweepPanel: the Compare window's "Batch sweep" tab. One model on one
// backend at several batch sizes (phaselab/batch_bench.h, what phaselab-cli
// bench --batch runs) on a worker thread, on CPU backends with the window's
// machine peaks (measured first where there are none usable); a table of the points and a chart of aggregate decode
// tokens/s and per-sequence TPOT against batch size, with the roofline: the
// bandwidth-bound ceiling and the batch where decode turns compute-bound.
#pragma once

#include <QStringList>
#include <QWidget>
#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "hardware_probe.h"
#include "phaselab/batch_bench.h"

class QChart;
class QChartView;
class QComboBox;
class QGraphicsSimpleTextItem;
class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QSpinBox;
class QTableWidget;
class QThread;

namespace phaselab::ui {

// Batched decode's roofline on this machine (phaselab/batch_bench.h); all
// zeros when the peaks were not measured (CUDA).
using DecodeRoof = DecodeRoofline;

// What the worker found before the first point: the backend it got and the roof.
struct SweepSetup {
  QString backend;         // Backend::name(): "cpu-avx2", "cuda", ...
  QString fallbackReason;  // non-empty when the kind asked for could not be used
  bool batchedForward = true;
  // CPU backends: the machine's peaks the roofline divides by. The window's
  // (the cached figure the phase meter divides by) where they are usable and
  // were measured with this sweep's thread count; else measured here, and
  // then, when measured the window's way (one thread per physical core),
  // handed to the window as its new figure (machinePeaksMeasured).
  HardwarePeaks peaks;
  bool peaksFromWindow = false;
  bool peaksForWindow = false;  // measured here the window's way
  QString peaksNote;       // the measurement's doubts, if any
  bool peaksDoubtful = false;  // the peaks looked wrong: no roofline is drawn from them
  DecodeRoof roof;
};

class BatchSweepPanel : public QWidget {
  Q_OBJECT
 public:
  explicit BatchSweepPanel(QWidget* parent = nullptr);
  ~BatchSweepPanel() override;

  // The models offered: the Compare window's variant files. The selection,
  // and models chosen here, are kept.
  void setModels(const QStringList& paths);
  void setModel(const QString& path);  // selects it, adding it when new
  QString model() const;
  void setBackendKind(const QString& kind);
  void setThreads(int threads);  // 0: one per physical core
  void setSweep(const QString& sizes, int nPrompt, int nGen);
  // While non-empty, why a sweep cannot start (the model comparison runs).
  void setBlockedReason(const QString& reason);

  bool start();  // false (and the reason shown) when the inputs are not valid
  void cancel();
  bool isRunning() const { return m_thread != nullptr; }
  const std::vector<BatchBenchPoint>& points() const { return m_points; }
  const SweepSetup& setup() const { return m_setup; }
  double ridge() const { return m_setup.roof.ridge_batch; }
  QString lastError() const { return m_lastError; }
  QTableWidget* table() const { return m_table; }
  QChart* chart() const { return m_chart; }
  QChartView* chartView() const { return m_chartView; }
  // The points as a JSON array (phaselab --batch-sweep --quit prints it).
  QByteArray pointsJson() const;

  // "1,2,4,8": sizes from 1 to 4096, sorted, each once; nullopt and *error
  // (what to type instead) otherwise.
  static std::optional<std::vector<int>> parseSizes(const QString& text, QString* error);

 signals:
  void runningChanged(bool running);
  void finished(bool ok, const QString& error);
  // The sweep measured the machine with one thread per physical core, as the
  // window's probe does: the window stores and shows the new figure.
  void machinePeaksMeasured(const HardwarePeaks& peaks);

 private:
  void chooseModel();
  void onStage(const QString& text, double fraction);
  void onSetup(const SweepSetup& setup);
  void onPoint(const BatchBenchPoint& p);
  void onDone(const QString& error, bool cancelled);
  void showPoints();
  void showChart();
  void placeRidgeLabel();
  void showSummary();
  void showError(const QString& message);
  void setRunning(bool running);

  QComboBox* m_model = nullptr;
  QPushButton* m_chooseModel = nullptr;
  QComboBox* m_backend = nullptr;
  QSpinBox* m_threads = nullptr;
  QLineEdit* m_sizes = nullptr;
  QSpinBox* m_nPrompt = nullptr;
  QSpinBox* m_nGen = nullptr;
  QPushButton* m_run = nullptr;
  QPushButton* m_cancel = nullptr;
  QProgressBar* m_progress = nullptr;
  QLabel* m_status = nullptr;
  QLabel* m_summary = nullptr;
  QTableWidget* m_table = nullptr;
  QChart* m_chart = nullptr;
  QChartView* m_chartView = nullptr;
  QGraphicsSimpleTextItem* m_ridgeLabel = nullptr;  // on the plot, beside the ridge's line
  QThread* m_thread = nullptr;
  std::shared_ptr<std::atomic<bool>> m_cancelFlag;
  std::vector<BatchBenchPoint> m_points;
  SweepSetup m_setup;
  int m_plannedSizes = 0, m_plannedMax = 0;
  QStringList m_chosen;  // models chosen here rather than in the Models tab
  QString m_blockedReason;
  QString m_lastError;
};

}  // namespace phaselab::ui
