// CompareWindow: models and quantizations side by side. Variants (model
// files, and quantizations of the first made on the fly and cached), each
// with its backend, KV cache and speculative setting, run through
// phaselab/compare.h on a worker thread (the chat stays usable) with a
// progress bar and Cancel; the results as a table and charts (tokens/s of
// prefill and decode, speed against quality, memory); every run saved in the
// conversation database and reopenable; CSV and JSON export. A second tab,
// the batch sweep (batch_sweep_panel.h), measures one model's throughput
// against batch size.
#pragma once

#include <QMainWindow>
#include <QPointer>
#include <atomic>
#include <memory>
#include <vector>

#include "phaselab/batch_bench.h"
#include "phaselab/compare.h"

class QChart;
class QChartView;
class QComboBox;
class QFormLayout;
class QHBoxLayout;
class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QSpinBox;
class QTableWidget;
class QTabWidget;
class QThread;

namespace phaselab::ui {

class BatchSweepPanel;
class ConversationStore;

class CompareWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit CompareWindow(ConversationStore* store, QWidget* parent = nullptr);
  ~CompareWindow() override;

  void addModel(const QString& path);
  // A quantization of the first model; false for an unknown type name.
  bool addQuantization(const QString& type);
  void setTextFile(const QString& path);
  void setChunks(int chunks);
  void setThreads(int threads);  // 0: one per physical core (both tabs)
  // Smaller speed tests (tests and quick looks): prefill and decode lengths.
  void setSpeedTests(int nPrompt, int nGen, int repetitions);
  int variantCount() const;

  bool startRun();  // false (and an error shown) when the variants are not valid
  void cancelRun();
  bool isRunning() const { return m_thread != nullptr; }
  const std::vector<CompareRow>& rows() const { return m_rows; }
  QString lastError() const { return m_lastError; }
  QTableWidget* resultsTable() const { return m_results; }
  QTabWidget* resultTabs() const { return m_tabs; }
  QList<QChartView*> chartViews() const;

  bool exportCsv(const QString& path);
  bool exportJson(const QString& path);
  // The saved runs (newest first) and reopening one.
  void refreshSavedRuns();
  bool openSavedRun(qint64 id);
  // The rows of compare_rows_json() text (a saved run, an exported file).
  static std::vector<CompareRow> rowsFromJson(const QByteArray& json, QString* error);

  // The batch sweep tab. Its model is the first variant's unless one is set
  // (or chosen there).
  void showBatchSweep();
  void setBatchModel(const QString& path);
  void setBatchBackend(const QString& kind);
  void setBatchSweep(const QString& sizes, int nPrompt, int nGen);
  bool startBatchSweep();  // false (and the reason shown in the tab) when the inputs are not valid
  void cancelBatchSweep();
  bool isBatchSweepRunning() const;
  const std::vector<BatchBenchPoint>& batchPoints() const;
  double batchRidge() const;  // 0 until a sweep on a CPU backend measured the peaks
  BatchSweepPanel* batchSweep() const { return m_sweep; }

 signals:
  void runFinished(bool ok, const QString& error);
  void batchSweepFinished(bool ok, const QString& error);

 protected:
  void closeEvent(QCloseEvent* e) override;

 private:
  // The constructor's sections, top to bottom.
  QHBoxLayout* buildSavedRunsRow();
  QWidget* buildVariantsPanel();
  QHBoxLayout* buildVariantButtons();
  QFormLayout* buildMeasurementForm();
  QHBoxLayout* buildRunRow();
  QTabWidget* buildResultTabs();
  void buildModes(QWidget* models);  // models: the Models tab's page
  void buildToolbar();

  void addVariantRow(const CompareVariant& v);
  std::vector<CompareVariant> variants() const;
  void chooseModel();
  void chooseText();
  void removeSelected();
  void offerVariantModels();
  void onProgress(const CompareProgress& p);
  void onDone(const std::vector<CompareRow>& rows, const QString& error, bool cancelled);
  void showRows();
  void showError(const QString& message);
  void setRunning(bool running);
  bool writeFile(const QString& path, const QByteArray& data);
  QByteArray optionsJson() const;

  ConversationStore* m_store;
  QTableWidget* m_variants = nullptr;
  QPushButton* m_addModel = nullptr;
  QPushButton* m_addQuant = nullptr;
  QPushButton* m_remove = nullptr;
  QLineEdit* m_text = nullptr;
  QSpinBox* m_chunks = nullptr;
  QSpinBox* m_threads = nullptr;
  QPushButton* m_run = nullptr;
  QPushButton* m_cancel = nullptr;
  QProgressBar* m_progress = nullptr;
  QLabel* m_status = nullptr;
  QComboBox* m_saved = nullptr;
  QTabWidget* m_modes = nullptr;  // Models | Batch sweep
  BatchSweepPanel* m_sweep = nullptr;
  QTabWidget* m_tabs = nullptr;
  QTableWidget* m_results = nullptr;
  QChart* m_speedChart = nullptr;
  QChart* m_qualityChart = nullptr;
  QChart* m_memoryChart = nullptr;
  QThread* m_thread = nullptr;
  std::shared_ptr<std::atomic<bool>> m_cancelFlag;
  std::vector<CompareRow> m_rows;
  int m_nPrompt = 512, m_nGen = 128, m_repetitions = 3;
  QString m_lastError;
};

}  // namespace phaselab::ui
