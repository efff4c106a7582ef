// ConversationList: the sidebar with search, New, Rename and Delete.
#pragma once

#include <QWidget>
#include <functional>

class QLineEdit;
class QListWidget;
class QListWidgetItem;
class QPushButton;

namespace phaselab::ui {

class ConversationStore;

class ConversationList : public QWidget {
  Q_OBJECT
 public:
  explicit ConversationList(ConversationStore* store, QWidget* parent = nullptr);

  void refresh();
  // The conversation open in the chat (0: a new one), shown as current.
  void setCurrent(qint64 id);
  qint64 currentId() const;
  int count() const;
  QLineEdit* searchField() const { return m_search; }
  // Asks before deleting; tests replace it (a modal box would block them).
  void setConfirmDelete(std::function<bool(const QString& title)> confirm) { m_confirmDelete = std::move(confirm); }

  bool renameCurrent(const QString& title);
  bool deleteCurrent();

 signals:
  void conversationSelected(qint64 id);
  void newConversationRequested();
  void conversationDeleted(qint64 id);

 private:
  void open(QListWidgetItem* item);  // emits conversationSelected unless it is open already

  ConversationStore* m_store;
  qint64 m_openId = -1;
  QLineEdit* m_search = nullptr;
  QListWidget* m_list = nullptr;
  QPushButton* m_rename = nullptr;
  QPushButton* m_delete = nullptr;
  bool m_refreshing = false;
  std::function<bool(const QString&)> m_confirmDelete;
};

}  // namespace phaselab::ui
