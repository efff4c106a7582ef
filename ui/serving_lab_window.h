// ServingLabWindow: prefill/decode interference, chunked prefill and
// disaggregation, measured and shown. The inputs (serving_inputs.h) make a
// `phaselab-cli bench --serving` run in a child process (serving_process.h)
// with progress and Cancel; its result (serving_result.h) fills a token
// timeline per policy (serving_timeline.h: the long prefill as a band, the
// stall as a gap in every chat lane), TTFT and ITL CDFs per policy, and a
// table of the CLI's figures. Every run is saved in the conversation
// database with its inputs and can be reopened; results export as JSON (the
// CLI's own) and CSV, and an exported JSON opens again (Open results…).
#pragma once

#include <QMainWindow>
#include <optional>

#include "serving_result.h"

class QChart;
class QComboBox;
class QLabel;
class QProgressBar;
class QPushButton;
class QScrollArea;
class QTabWidget;
class QTableWidget;

namespace phaselab::ui {

class ConversationStore;
class ServingInputs;
class ServingProcess;
class ServingTimelineWidget;
struct ServingProgress;
struct ServingRequest;

class ServingLabWindow : public QMainWindow {
  Q_OBJECT
 public:
  explicit ServingLabWindow(ConversationStore* store, QWidget* parent = nullptr);
  ~ServingLabWindow() override;

  ServingInputs* inputs() const { return m_inputs; }
  // The phaselab-cli that measures (tests); empty: CompareProcess::findCli().
  void setCliPath(const QString& path) { m_cliPath = path; }

  bool startRun();  // false (and the reason shown) when the inputs cannot run
  void cancelRun();
  bool isRunning() const;
  QString childCommand() const;
  qint64 childProcessId() const;

  // The result shown (a run's, a saved one's, an imported one's).
  const std::optional<ServingResult>& result() const { return m_result; }
  void showResult(const ServingResult& result);
  // Saves result with the inputs as they are now; the new run's id, 0 on failure.
  qint64 saveResult(const ServingResult& result, const QString& title);
  void refreshSavedRuns();
  bool openSavedRun(qint64 id);
  // An exported JSON (or the CLI's --json output) shown and saved.
  bool importResults(const QString& path);
  bool exportCsv(const QString& path);
  bool exportJson(const QString& path);
  // The inputs a result was measured with (the model by its file name).
  static ServingRequest requestFromResult(const ServingResult& r);

  QString lastError() const { return m_lastError; }
  QTableWidget* resultsTable() const { return m_table; }
  ServingTimelineWidget* timeline() const { return m_timeline; }
  QComboBox* policySelector() const { return m_policy; }
  QComboBox* savedRuns() const { return m_saved; }
  QChart* ttftChart() const { return m_ttftChart; }
  QChart* itlChart() const { return m_itlChart; }
  QTabWidget* resultTabs() const { return m_tabs; }
  QLabel* explanation() const { return m_explanation; }
  QLabel* cdfLegend() const { return m_cdfLegend; }

 signals:
  void runFinished(bool ok, const QString& error);

 protected:
  void closeEvent(QCloseEvent* e) override;

 private:
  QLayout* buildSavedRunsRow();
  QWidget* buildInputsPanel();
  QWidget* buildResultsPanel();
  QWidget* buildTimelineTab();
  QWidget* buildDistributionsTab();
  void onProgress(const ServingProgress& p);
  void onDone(const ServingResult& result, const QString& error, bool cancelled);
  void showTimeline(int rowIndex);
  void fillTable();
  void fillCharts();
  void clearResult();
  void showError(const QString& message);
  void setRunning(bool running);
  bool writeFile(const QString& path, const QByteArray& data);
  QByteArray optionsJson() const;
  void restoreOptions(const QByteArray& options);

  ConversationStore* m_store;
  ServingInputs* m_inputs = nullptr;
  ServingProcess* m_process = nullptr;
  QString m_cliPath;
  QComboBox* m_saved = nullptr;
  QPushButton* m_run = nullptr;
  QPushButton* m_cancel = nullptr;
  QProgressBar* m_progress = nullptr;
  QLabel* m_status = nullptr;
  QLabel* m_explanation = nullptr;
  QLabel* m_runInfo = nullptr;
  QTabWidget* m_tabs = nullptr;
  QComboBox* m_policy = nullptr;
  ServingTimelineWidget* m_timeline = nullptr;
  QChart* m_ttftChart = nullptr;
  QChart* m_itlChart = nullptr;
  QLabel* m_cdfLegend = nullptr;
  QTableWidget* m_table = nullptr;
  QScrollArea* m_scroll = nullptr;
  std::optional<ServingResult> m_result;
  QString m_lastError;
};

}  // namespace phaselab::ui
