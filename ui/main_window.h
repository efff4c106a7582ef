// MainWindow: conversation list | chat | metrics dock, with the menus,
// shortcuts, model loading and banners that tie them together. Its
// definitions are spread by concern: main_window.cpp (the layout and the
// wiring), main_window_banners.cpp, main_window_menus.cpp,
// main_window_model.cpp and main_window_conversation.cpp.
#pragma once

#include <QMainWindow>

#include "app_settings.h"
#include "conversation_store.h"
#include "hardware_probe.h"

class QDockWidget;
class QProgressDialog;
class QStackedWidget;
class QVBoxLayout;

namespace phaselab::ui {

class EngineController;
class ChatSession;
class ChatView;
class ChatComposer;
class ConversationList;
class MetricsDock;
class WelcomePage;
class CompareWindow;
class ServingLabWindow;
class Banner;
class ChatToolbar;
class StatusBarLabels;

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
  const EngineConfig& engineConfig() const { return m_settings.engine; }
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
  // The Serving lab (File > Serving Lab), made on first use.
  ServingLabWindow* servingLabWindow();
  // The machine's CPU peaks, newly measured (the probe, or a batch sweep
  // with one thread per physical core): stored as the one cached figure the
  // batch sweep also uses, and shown by the phase meter (unless it shows a
  // GPU model's peaks).
  void setMachinePeaks(const HardwarePeaks& peaks);
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
  void dragEnterEvent(QDragEnterEvent* e) override;
  void dropEvent(QDropEvent* e) override;

 private:
  // The constructor's parts (main_window.cpp).
  // The chat column: banners, the chat toolbar, the chat or the welcome page.
  QVBoxLayout* createCentral();
  void createDocks();
  void connectChat();
  void connectEngine();
  void restoreWindow();

  // Banners and the conversation database (main_window_banners.cpp).
  void createBanners(QVBoxLayout* column);
  // Opens the database at dbPath; one that cannot be used leaves the
  // conversations in memory and a banner (inserted in column) that says so.
  void openStore(const QString& dbPath, QVBoxLayout* column);
  void showError(const QString& message);
  void clearError();
  void updateBaseModelNote();

  // Menus and toolbars (main_window_menus.cpp).
  void createMenus();
  void createFileMenu();
  void createChatMenu();
  void createViewMenu();
  void createSettingsAndHelpMenus();
  // The chat toolbar's KV cache and speculative toggles: they change the
  // generation settings for the next message, no reload.
  void createChatToolbar(QVBoxLayout* column);
  void syncChatToolbar();

  // The model: loading, serving, settings, the machine's peaks
  // (main_window_model.cpp).
  void onModelLoadStarted(const QString& path);
  void onModelLoaded(const ModelInfo& info);
  // A load failed or was cancelled: the model still loaded (if any) is shown.
  void onModelLoadEnded(bool cancelled);
  void showModelHeader(const ModelInfo& info);  // the status bar's model and the title
  void onServerStarted(const QString& url);
  void onServerStopped();
  void onServerFailed(const QString& error);
  void openModelDialog();
  void openModelManager();
  // serversPage: open on Settings > Servers (a remote server, the API server).
  void openSettings(bool serversPage = false);
  void startHardwareProbe();
  // The cached peaks, and a first probe when there are none (measureHardware).
  void setUpHardwarePeaks(bool measureHardware);

  // The conversation (main_window_conversation.cpp).
  void applyGenerationSettings(const GenerationSettings& g);
  void applyConversationSettings(const ConversationSettings& s);
  void openConversationSettings();
  void regenerateMessage(qint64 id);
  void editMessage(qint64 id);
  void exportDialog();
  void importDialog();

  void onBusyChanged(bool busy);
  void updateDockLayout();
  // The welcome page replaces the chat while no model is loaded (or loading)
  // and the open conversation is empty.
  void updateWelcome();

  Options m_options;
  AppSettings m_settings;
  EngineConfig m_loadedConfig;  // the loaded model's (ModelInfo::config), to tell what a change reloads
  ConversationStore m_store;
  EngineController* m_engine = nullptr;
  ChatSession* m_chat = nullptr;
  ConversationList* m_conversations = nullptr;
  ChatView* m_chatView = nullptr;
  ChatComposer* m_composer = nullptr;
  MetricsDock* m_metrics = nullptr;
  Banner* m_errorBanner = nullptr;
  Banner* m_storeWarning = nullptr;   // the database cannot be used
  Banner* m_baseModelNote = nullptr;  // a model without a chat template
  QStackedWidget* m_pages = nullptr;  // the chat, or the welcome page
  QString m_dbPath;
  QWidget* m_chatPage = nullptr;
  ChatToolbar* m_chatToolbar = nullptr;
  WelcomePage* m_welcomePage = nullptr;
  StatusBarLabels* m_statusLabels = nullptr;
  QString m_serveStatus;  // for the Settings dialog: the address, the failure, or "Not serving."
  QProgressDialog* m_loadProgress = nullptr;
  QString m_lastError;
  QDockWidget* m_listDock = nullptr;
  bool m_narrow = false;
  bool m_probing = false;  // the hardware probe runs
  bool m_probeWaiting = false;  // it waits for the engine to be idle
  bool m_probeRetryConnected = false;
  CompareWindow* m_compare = nullptr;
  ServingLabWindow* m_servingLab = nullptr;
  bool m_baseModelNoteDismissed = false;
};

}  // namespace phaselab::ui
