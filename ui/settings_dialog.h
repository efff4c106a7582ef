// SettingsDialog: backend, threads, context, sampling, system prompt, KV cache;
// a remote OpenAI-compatible server instead of a local model; serving the
// loaded model over the OpenAI API.
#pragma once

#include <QDialog>

#include "app_settings.h"

class QComboBox;
class QSpinBox;
class QDoubleSpinBox;
class QCheckBox;
class QPlainTextEdit;
class QLineEdit;
class QLabel;
class QTabWidget;
class QGroupBox;

namespace phaselab::ui {

class SettingsDialog : public QDialog {
  Q_OBJECT
 public:
  // loaded: the engine configuration of the model now loaded (to tell which
  // changes need a reload); hasModel false when none is.
  SettingsDialog(const AppSettings& current, const EngineConfig& loaded, bool hasModel, QWidget* parent = nullptr);

  AppSettings settings() const;
  bool needsReload() const;
  // The loaded model's trained context (0: none loaded): the context size is
  // checked against it before the dialog closes.
  void setTrainedContext(int tokens);
  // Why the engine settings cannot be applied ("" when they can): a context
  // below kMinContext or beyond the model's trained context.
  QString engineError() const;
  static constexpr int kMinContext = 128;  // a chat template and a short answer need room

  void accept() override;  // refuses (and says why) while engineError() is not empty
  // The server's state now: "Serving at URL", why it failed, or not serving.
  // MainWindow keeps it current while the dialog is open.
  void setServeStatus(const QString& text);
  QString serveStatus() const;
  // Opens on the Servers page (File > Remote Server…).
  void showServersPage();

 private:
  // The dialog's sections, each with its controls set to the current values.
  QGroupBox* buildEngineBox(const EngineConfig& engine);
  QGroupBox* buildGenerationBox(const GenerationSettings& g);
  QGroupBox* buildRemoteBox(const AppSettings& current);
  QGroupBox* buildServeBox(const AppSettings& current);
  void updateReloadNote();

  AppSettings m_initial;
  EngineConfig m_loaded;
  bool m_hasModel;
  QComboBox* m_backend = nullptr;
  QSpinBox* m_threads = nullptr;
  QSpinBox* m_context = nullptr;
  QComboBox* m_kvType = nullptr;
  QDoubleSpinBox* m_temperature = nullptr;
  QSpinBox* m_topK = nullptr;
  QDoubleSpinBox* m_topP = nullptr;
  QDoubleSpinBox* m_minP = nullptr;
  QDoubleSpinBox* m_repeatPenalty = nullptr;
  QLineEdit* m_seed = nullptr;
  QSpinBox* m_maxTokens = nullptr;
  QCheckBox* m_kvCache = nullptr;
  QCheckBox* m_prefixCache = nullptr;
  QComboBox* m_speculative = nullptr;
  QSpinBox* m_specK = nullptr;
  QLineEdit* m_draftModel = nullptr;
  QLineEdit* m_specSkip = nullptr;
  QPlainTextEdit* m_systemPrompt = nullptr;
  QCheckBox* m_useRemote = nullptr;
  QLineEdit* m_remoteUrl = nullptr;
  QLineEdit* m_remoteKey = nullptr;
  QLineEdit* m_remoteModel = nullptr;
  QCheckBox* m_serve = nullptr;
  QSpinBox* m_servePort = nullptr;
  QLabel* m_serveStatus = nullptr;
  QLabel* m_reloadNote = nullptr;
  QLabel* m_engineError = nullptr;
  int m_trainedContext = 0;
  QTabWidget* m_tabs = nullptr;
};

}  // namespace phaselab::ui
