// CompareWindow: models and quantizations side by side. Variants (model
// files, and quantizations of the first made on the fly and cached), each
// with its backend, KV cache and speculative setting, measured by
// `phaselab-cli compare` in a child process (compare_process.h: each
// variant's peak memory is its own, the figures are the CLI's) with a
// progress bar and Cancel; the results, each speed as mean ± sd, fill a
// table as each variant finishes, and charts (prefill and decode tokens/s
// each on its own axis, speed against quality, memory); every run saved in
// the conversation database with its inputs and reopenable (Run repeats it);
// CSV and JSON export. A second tab, the batch sweep (batch_sweep_panel.h),
// measures one model's throughput against batch size.
#pragma once

#include <QMainWindow>
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
class QScrollArea;
class QTabWidget;

namespace phaselab::ui {

class BatchSweepPanel;
class CompareProcess;
class ConversationStore;

class CompareWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit CompareWindow(ConversationStore* store, QWidget* parent = nullptr);
  ~CompareWindow() override;

  void addModel(const QString& path);
  // A quantization of the first model; false for an unknown type name.
  bool addQuantization(const QString& type);
  // A layer drop of the first model ("layers:A-B" or "layers:nN", prune.h).
  bool addPruned(const QString& spec);
  // Marks variant row as a speculative draft of the first (its checkbox).
  void setDraft(int row, bool draft);
  // Shows the results tab of that title ("Drafts"); false when none has it.
  bool showResultTab(const QString& title);
  void setTextFile(const QString& path);
  void setChunks(int chunks);
  void setThreads(int threads);  // 0: one per physical core (both tabs)
  // Smaller speed tests (tests and quick looks): prefill and decode lengths.
  void setSpeedTests(int nPrompt, int nGen, int repetitions);
  int variantCount() const;
  std::vector<CompareVariant> variants() const;
  QString textFile() const;
  int chunks() const;
  int threads() const;
  int repetitions() const { return m_repetitions; }
  // The phaselab-cli that measures (tests point it at the build's); empty:
  // CompareProcess::findCli() at each run.
  void setCliPath(const QString& path) { m_cliPath = path; }

  bool startRun();  // false (and an error shown) when the variants are not valid
  void cancelRun();
  bool isRunning() const;
  // The child process of the current or last run: its pid (0 before the
  // first) and its command line (what a person can run to get the same).
  qint64 childProcessId() const;
  QStringList childArguments() const;
  QString childCommand() const;
  const std::vector<CompareRow>& rows() const { return m_rows; }
  QString lastError() const { return m_lastError; }
  QTableWidget* resultsTable() const { return m_results; }
  QTableWidget* variantsTable() const { return m_variants; }
  QTabWidget* resultTabs() const { return m_tabs; }
  QList<QChartView*> chartViews() const;
  QChart* prefillChart() const { return m_prefillChart; }
  QChart* decodeChart() const { return m_decodeChart; }
  QChart* qualityChart() const { return m_qualityChart; }
  QChart* acceptanceChart() const { return m_acceptanceChart; }
  QScrollArea* modelsScrollArea() const { return m_scroll; }

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
  void resizeEvent(QResizeEvent* e) override;

 private:
  // The constructor's sections, top to bottom.
  QHBoxLayout* buildSavedRunsRow();
  QWidget* buildVariantsPanel();
  QHBoxLayout* buildVariantButtons();
  QFormLayout* buildMeasurementForm();
  QHBoxLayout* buildRunRow();
  QTabWidget* buildResultTabs();
  void buildModes(QWidget* models);  // models: the Models tab's page

  void addVariantRow(const CompareVariant& v);
  void restoreOptions(const QByteArray& options);
  void chooseModel();
  void chooseText();
  void removeSelected();
  void offerVariantModels();
  void fitVariantsTable();
  void onProgress(const CompareProgress& p);
  void onRowMeasured(const CompareRow& row);
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
  QPushButton* m_addPrune = nullptr;
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
  QChart* m_prefillChart = nullptr;
  QChart* m_decodeChart = nullptr;
  QChart* m_qualityChart = nullptr;
  QChart* m_memoryChart = nullptr;
  QChart* m_acceptanceChart = nullptr;
  QScrollArea* m_scroll = nullptr;  // the Models page: scrolls rather than cut below its minimum
  CompareProcess* m_process = nullptr;
  QString m_cliPath;
  std::vector<CompareRow> m_rows;
  int m_nPrompt = 512, m_nGen = 128, m_repetitions = 3;
  QString m_lastError;
};

}  // namespace phaselab::ui
