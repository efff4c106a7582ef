// GetModelsDialog (File > Get Models…): search Hugging Face (or the mirror
// HF_ENDPOINT names) for GGUF repositories, see a repository's licence and
// its GGUF files with their size and whether each fits this machine's
// memory, and download one into the model folder with progress, Pause /
// Resume and Cancel. The engine's hub client (phaselab/hub.h) does the work;
// every call runs on a worker thread and comes back queued to the GUI
// thread, where a generation counter drops answers the person has moved on
// from (a newer search, another repository, another context size).
#pragma once

#include <QDialog>
#include <QPointer>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "phaselab/hub.h"

class QComboBox;
class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;
class QSpinBox;
class QStackedWidget;
class QTableWidget;
class QTimer;

namespace phaselab::ui {

class HubTokenStore;

class GetModelsDialog : public QDialog {
  Q_OBJECT
 public:
  enum ResultColumn { RepoColumn, DownloadsColumn, LikesColumn, UpdatedColumn, LicenceColumn, GatedColumn };
  enum FileColumn { FileNameColumn, QuantColumn, SizeColumn, FitsColumn };
  enum class DownloadState { idle, running, paused, done };
  // Models whose fit is estimated as soon as a repository is shown (each
  // reads the first MiBs of the file); the others when selected.
  static constexpr int kFitCap = 6;

  // tokens: where the Hugging Face token is kept; null: the desktop's secret
  // store (service "PhaseLab"). Tests pass one that never touches it.
  explicit GetModelsDialog(const QString& modelDir, QWidget* parent = nullptr, HubTokenStore* tokens = nullptr);
  // Pauses a running download (the partial file stays for a later resume)
  // and waits a moment for it to stop; queries still running are not waited
  // for (their answers are dropped).
  ~GetModelsDialog() override;

  // The endpoint and timeouts (tests: a fake hub). The stored token is added
  // when these carry none. Default: HubOptions::from_environment().
  void setHubOptions(const hub::HubOptions& options);
  // What a hub call is given now.
  hub::HubOptions hubOptions() const;
  HubTokenStore* tokenStore() const { return m_tokens; }

  void search();  // the search box's text with the chosen order
  void openTokenDialog();

  DownloadState downloadState() const { return m_dlState; }
  QString savedPath() const { return m_savedPath; }  // the first part's, after a download

  QLineEdit* searchEdit() const { return m_search; }
  QComboBox* sortCombo() const { return m_sort; }
  QPushButton* searchButton() const { return m_searchButton; }
  QPushButton* tokenButton() const { return m_tokenButton; }
  QLabel* tokenLabel() const { return m_tokenLabel; }
  QTableWidget* resultsTable() const { return m_results; }
  // Shown in place of the results while searching, on failure, on no match.
  QLabel* resultsMessage() const { return m_resultsMessage; }
  bool isResultsMessageShown() const;
  QLabel* licenceLabel() const { return m_licence; }
  QLabel* repoNote() const { return m_repoNote; }  // gated, the model card, a failure
  QSpinBox* contextSpin() const { return m_context; }
  QTableWidget* filesTable() const { return m_files; }
  QPushButton* downloadButton() const { return m_download; }
  QPushButton* pauseButton() const { return m_pause; }
  QPushButton* cancelButton() const { return m_cancel; }
  QPushButton* loadButton() const { return m_load; }
  QProgressBar* progressBar() const { return m_progress; }
  QLabel* statusLabel() const { return m_status; }

 signals:
  void modelDownloaded(const QString& path);

 public slots:
  void done(int r) override;

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
    bool download = false;  // stops when paused: the destructor waits for it
  };

  QWidget* buildResultsPanel();
  QWidget* buildFilesPanel();
  QLayout* buildDownloadRow();
  // Runs work on a thread of its own, joined by the destructor (or, still
  // running then, as the application ends).
  void spawn(std::function<void()> work, bool download = false);
  void reapWorkers();

  void showResultsMessage(const QString& text);
  void onSearchDone(int generation, const Result<std::vector<hub::ModelSummary>>& result);
  void selectRepository(int row);
  void onRepoInfo(int generation, const Result<hub::RepoInfo>& result);
  void showRepoFailure(const QString& repo, const QString& message);
  void startFits(const std::vector<int>& rows);
  void refitAll();
  void onFit(int generation, int row, const Result<hub::FitEstimate>& fit);
  int selectedFileRow() const;

  void startDownload();  // m_dlInfo / m_dlModel, from where a pause left it
  void pauseOrResume();
  void cancelDownload();
  void onProgress(int generation, const hub::DownloadProgress& p);
  void onDownloadDone(int generation, const Result<hub::DownloadResult>& result);
  void updateButtons();
  void updateTokenLabel();
  void setStatus(const QString& text);

  QString m_modelDir;
  HubTokenStore* m_tokens = nullptr;
  hub::HubOptions m_options;

  QLineEdit* m_search = nullptr;
  QComboBox* m_sort = nullptr;
  QPushButton* m_searchButton = nullptr;
  QPushButton* m_tokenButton = nullptr;
  QLabel* m_tokenLabel = nullptr;
  QStackedWidget* m_resultsStack = nullptr;
  QTableWidget* m_results = nullptr;
  QLabel* m_resultsMessage = nullptr;
  QLabel* m_licence = nullptr;
  QLabel* m_repoNote = nullptr;
  QSpinBox* m_context = nullptr;
  QTimer* m_refit = nullptr;
  QTableWidget* m_files = nullptr;
  QPushButton* m_download = nullptr;
  QPushButton* m_pause = nullptr;
  QPushButton* m_cancel = nullptr;
  QPushButton* m_load = nullptr;
  QProgressBar* m_progress = nullptr;
  QLabel* m_status = nullptr;

  std::vector<hub::ModelSummary> m_summaries;  // the results table's rows
  std::optional<hub::RepoInfo> m_repo;         // the files table's repository
  int m_searchGen = 0;
  int m_repoGen = 0;
  int m_fitGen = 0;
  // The fit workers stop early once the generation moves on.
  std::shared_ptr<std::atomic<int>> m_fitGenShared = std::make_shared<std::atomic<int>>(0);
  std::vector<int> m_fitAsked;  // files-table rows estimated (or being) in this generation

  DownloadState m_dlState = DownloadState::idle;
  hub::RepoInfo m_dlInfo;  // what is (or was) downloading, for Resume
  hub::GgufChoice m_dlModel;
  std::shared_ptr<hub::DownloadControl> m_control;
  int m_dlGen = 0;
  QString m_savedPath;

  std::vector<Worker> m_workers;
};

}  // namespace phaselab::ui
