// MainWindow: conversation list | chat | metrics dock, with the menus,
// shortcuts, model loading and error banner that tie them together.
#pragma once

#include <QMainWindow>

#include "app_settings.h"
#include "conversation_store.h"
#include "hardware_probe.h"

class QLabel;
class QProgressDialog;
class QFrame;
class QPushButton;

class QVBoxLayout;
class QCheckBox;
class QComboBox;
class QDockWidget;
class QStackedWidget;

namespace phaselab::ui {

class EngineController;
class ChatSession;
class ChatView;
class ChatComposer;
class ConversationList;
class MetricsDock;
class WelcomePage;
class CompareWindow;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  struct Options {
    QString dbPath;                 // empty: ConversationStore::defaultPath()
    bool measureHardware = true;    // run the bandwidth/FLOP probe when not cached
    bool autoLoadLastModel = true;  // reload the model of the previous session
    bool rememberModel = true;      // store the loaded model for the next start
  };

  explicit MainWindow(const Options& options, QWidget* parent = nullptr);
  ~MainWindow() override;

  void loadModel(const QString& path);
  // Chat with a remote OpenAI-compatible server instead (Settings > Servers).
  void connectRemote(const RemoteConfig& remote);
  bool sendMessage(const QString& text);
  const GenerationSettings& generationSettings() const { return m_settings.generation; }
  // Overrides for this run only (screenshot mode, tests); not saved.
  void setGenerationSettings(const GenerationSettings& g);
  void setEngineConfig(const EngineConfig& e);
  // "chat" or "notebook" for the open conversation (and the next new one).
  void setConversationMode(const QString& mode);
  const AppSettings& settings() const { return m_settings; }

  QString lastError() const { return m_lastError; }
  bool isErrorShown() const;
  EngineController* engine() const { return m_engine; }
  ChatSession* chatSession() const { return m_chat; }
  ChatView* chatView() const { return m_chatView; }
  ChatComposer* composer() const { return m_composer; }
  ConversationList* conversationList() const { return m_conversations; }
  MetricsDock* metricsDock() const { return m_metrics; }
  WelcomePage* welcomePage() const { return m_welcomePage; }
  bool isWelcomeShown() const;
  bool isStoreWarningShown() const;
  bool isNotSavedShown() const;
  bool isBaseModelNoteShown() const;
  // The status bar's "Serving at http://127.0.0.1:PORT/v1" (empty when not serving).
  QString serveLabelText() const;
  // Starts or stops the API server as the settings say (serve, port) for the
  // model now loaded; the engine stops it itself when the model goes.
  void applyServeSettings();
  // Overrides for this run only (tests); saved like the Settings dialog's OK.
  void setServeSettings(bool serve, int port);
  // Below this width the conversation list joins the metrics as a tab on the
  // right, so that the chat keeps most of a small window.
  static constexpr int kNarrowWidth = 1100;
  bool isNarrowLayout() const { return m_narrow; }
  // The Compare window (File > Compare Models), made on first use.
  CompareWindow* compareWindow();
  // File > Export / Import without the file dialogs (tests, scripts).
  bool exportConversation(const QString& path);  // .md: Markdown, else JSON
  bool importConversations(const QString& path);
  // Renames the database that could not be used and starts a fresh one.
  void moveDatabaseAside();
  ConversationStore* store() { return &m_store; }

 signals:
  void modelReady();

 protected:
  void closeEvent(QCloseEvent* e) override;
  void resizeEvent(QResizeEvent* e) override;
  // The status bar's model label: its text, shown whole unless a transient
  // message needs the room (fitStatusBar).
  void setModelLabel(const QString& text);
  // While the status bar shows a message, the model label gives up the width
  // the message needs (its text elided, whole in its tooltip): at 800x600
  // the permanent labels had left a message two letters.
  void fitStatusBar();
  void dragEnterEvent(QDragEnterEvent* e) override;
  void dropEvent(QDropEvent* e) override;

 private:
  void createMenus();
  // The chat toolbar's KV cache and speculative toggles: they change the
  // generation settings for the next message, no reload.
  void createChatToolbar(QVBoxLayout* column);
  void syncChatToolbar();
  void applyConversationSettings(const ConversationSettings& s);
  void openConversationSettings();
  void updateBaseModelNote();
  void updateDockLayout();
  void exportDialog();
  void importDialog();
  void applyGenerationSettings(const GenerationSettings& g);
  void showError(const QString& message);
  void clearError();
  void onModelLoaded(const ModelInfo& info);
  void onBusyChanged(bool busy);
  void openModelDialog();
  void openModelManager();
  // serversPage: open on Settings > Servers (a remote server, the API server).
  void openSettings(bool serversPage = false);
  void regenerateMessage(qint64 id);
  void editMessage(qint64 id);
  void startHardwareProbe();
  // The welcome page replaces the chat while no model is loaded (or loading)
  // and the open conversation is empty.
  void updateWelcome();

  Options m_options;
  AppSettings m_settings;
  EngineConfig m_loadedConfig;
  ConversationStore m_store;
  EngineController* m_engine = nullptr;
  ChatSession* m_chat = nullptr;
  ConversationList* m_conversations = nullptr;
  ChatView* m_chatView = nullptr;
  ChatComposer* m_composer = nullptr;
  MetricsDock* m_metrics = nullptr;
  QFrame* m_errorBanner = nullptr;
  QLabel* m_errorText = nullptr;
  QStackedWidget* m_pages = nullptr;  // the chat, or the welcome page
  QFrame* m_storeWarning = nullptr;   // the database cannot be used
  QLabel* m_storeWarningText = nullptr;
  QLabel* m_notSavedLabel = nullptr;
  QString m_dbPath;
  QWidget* m_chatPage = nullptr;
  WelcomePage* m_welcomePage = nullptr;
  QLabel* m_modelLabel = nullptr;
  QString m_modelText;  // the model label's whole text (it shows less while a message needs the room)
  QLabel* m_serveLabel = nullptr;
  QString m_serveStatus;  // for the Settings dialog: the address, the failure, or "Not serving."
  QProgressDialog* m_loadProgress = nullptr;
  QString m_lastError;
  QString m_loadingPath;
  QCheckBox* m_kvToggle = nullptr;
  QComboBox* m_specCombo = nullptr;
  QLabel* m_specLabel = nullptr;
  QComboBox* m_modeCombo = nullptr;
  QFrame* m_baseModelNote = nullptr;
  QLabel* m_baseModelText = nullptr;
  QDockWidget* m_listDock = nullptr;
  bool m_narrow = false;
  bool m_probing = false;  // the hardware probe runs
  bool m_probeWaiting = false;  // it waits for the engine to be idle
  bool m_probeRetryConnected = false;
  CompareWindow* m_compare = nullptr;
  bool m_baseModelNoteDismissed = false;
};

}  // namespace phaselab::ui
