// HubTokenStore: the Hugging Face token the Get Models dialog sends, kept in
// the desktop's secret store (QtKeychain: the Secret Service, KWallet, the
// macOS keychain or the Windows credential store), never in QSettings or a
// file. HF_TOKEN in the environment takes precedence over a stored one.
// Where there is no secret store (a headless machine: no D-Bus secret
// service) a token entered is kept in memory until the application quits,
// and the status says so.
//
// HubTokenDialog (Token…) enters or removes it.
//
// The secret store answers asynchronously: load() asks, changed() tells
// when the answer (or a save's) is in.
#pragma once

#include <QDialog>
#include <QObject>
#include <QString>

class QLabel;
class QLineEdit;
class QPushButton;

namespace phaselab::ui {

class HubTokenStore : public QObject {
  Q_OBJECT
 public:
  enum class Source { none, environment, secretStore, memory };

  // service: the secret store's service name ("PhaseLab"; tests use another
  // so that a developer's own entry is never read or overwritten).
  explicit HubTokenStore(QObject* parent = nullptr, const QString& service = QStringLiteral("PhaseLab"));

  // Off: the secret store is never asked and a token is kept in memory
  // (tests, for a deterministic run on any desktop).
  void setSecretStoreEnabled(bool on) { m_secretStoreEnabled = on; }

  // Reads the stored token; changed() when done.
  void load();
  // Stores token (empty: removes it); changed() when done.
  void save(const QString& token);

  // The token to send: HF_TOKEN's, else the stored one, else "".
  QString token() const;
  Source source() const;
  bool isBusy() const { return m_busy > 0; }
  // One line for the dialog: where the token comes from, or why it is only
  // kept for this session.
  QString statusText() const;

  // The secret store refused (no backend): a token saved goes to memory.
  bool secretStoreUnavailable() const { return m_storeUnavailable; }
  // Why the secret store refused, as it said (for a tooltip).
  QString storeError() const { return m_storeError; }

  static QString environmentToken();
  static constexpr const char* kKey = "huggingface-token";

 signals:
  void changed();

 private:
  void keepInMemory(const QString& token, const QString& why);

  QString m_service;
  bool m_secretStoreEnabled = true;
  bool m_storeUnavailable = false;  // the secret store refused (no backend)
  QString m_storeError;
  QString m_stored;                 // read from / written to the secret store
  int m_busy = 0;
};

// The small dialog behind Token…: the token in a password field, Save and
// Remove, and where it will be kept.
class HubTokenDialog : public QDialog {
  Q_OBJECT
 public:
  explicit HubTokenDialog(HubTokenStore* store, QWidget* parent = nullptr);

  QLineEdit* tokenEdit() const { return m_edit; }
  QPushButton* saveButton() const { return m_save; }
  QPushButton* removeButton() const { return m_remove; }

 private:
  HubTokenStore* m_store;
  QLineEdit* m_edit = nullptr;
  QLabel* m_where = nullptr;
  QPushButton* m_save = nullptr;
  QPushButton* m_remove = nullptr;
};

}  // namespace phaselab::ui
