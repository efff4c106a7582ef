// WelcomePage: what the window shows while no model is loaded. It offers the
// default model (download it with a progress bar and Cancel, or load it when
// it is already in the model folder) and opening any GGUF file.
#pragma once

#include <QWidget>

class QLabel;
class QProgressBar;
class QPushButton;

namespace phaselab::ui {

class ModelFetcher;

class WelcomePage : public QWidget {
  Q_OBJECT
 public:
  explicit WelcomePage(QWidget* parent = nullptr);

  ModelFetcher* fetcher() const { return m_fetcher; }
  // Re-reads whether the default model is present (after a load or unload).
  void refresh();

 signals:
  void openFileRequested();
  void loadRequested(const QString& path);

 private:
  void setFetching(bool fetching);

  ModelFetcher* m_fetcher = nullptr;
  QLabel* m_defaultText = nullptr;
  QPushButton* m_fetchButton = nullptr;   // "Download" or "Load", by presence
  QPushButton* m_openButton = nullptr;
  QProgressBar* m_progress = nullptr;
  QPushButton* m_cancelButton = nullptr;
  QLabel* m_status = nullptr;
};

}  // namespace phaselab::ui
