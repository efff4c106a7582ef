#include "conversation_list.h"

#include <QHBoxLayout>
#include <QInputDialog>
#include <QLineEdit>
#include <QListWidget>
#include <QMessageBox>
#include <QPushButton>
#include <QVBoxLayout>

#include "conversation_store.h"

namespace phaselab::ui {

namespace {

// Tabbing into a list with no current item makes its first item current
// (QAbstractItemView::focusInEvent). That is where the keyboard focus
// lands, not a choice: the list knows it is only focus moving.
class ConversationListView : public QListWidget {
 public:
  bool isTakingFocus() const { return m_takingFocus; }

 protected:
  void focusInEvent(QFocusEvent* e) override {
    m_takingFocus = true;
    QListWidget::focusInEvent(e);
    m_takingFocus = false;
  }

 private:
  bool m_takingFocus = false;
};

}  // namespace

ConversationList::ConversationList(ConversationStore* store, QWidget* parent) : QWidget(parent), m_store(store) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  auto* newButton = new QPushButton(tr("New chat"));
  newButton->setToolTip(tr("Start a new conversation (Ctrl+N)"));
  layout->addWidget(newButton);
  m_search = new QLineEdit;
  m_search->setAccessibleName(tr("Search conversations"));
  m_search->setPlaceholderText(tr("Search conversations"));
  m_search->setClearButtonEnabled(true);
  layout->addWidget(m_search);
  auto* view = new ConversationListView;
  m_list = view;
  m_list->setObjectName(QStringLiteral("conversationList"));
  m_list->setAccessibleName(tr("Conversations"));
  layout->addWidget(m_list, 1);
  auto* row = new QHBoxLayout;
  m_rename = new QPushButton(tr("Rename"));
  m_delete = new QPushButton(tr("Delete"));
  row->addWidget(m_rename);
  row->addWidget(m_delete);
  layout->addLayout(row);

  m_confirmDelete = [this](const QString& title) {
    return QMessageBox::question(this, tr("Delete conversation"),
                                 tr("Delete \"%1\" and all its messages? This cannot be undone.").arg(title)) ==
           QMessageBox::Yes;
  };
  connect(newButton, &QPushButton::clicked, this, &ConversationList::newConversationRequested);
  connect(m_search, &QLineEdit::textChanged, this, &ConversationList::refresh);
  // The arrow keys and a click open the conversation they move to; Tab only
  // moves the focus. Enter (or a click) opens the item that focus made
  // current.
  connect(m_list, &QListWidget::currentItemChanged, this, [this, view](QListWidgetItem* item) {
    if (!m_refreshing && !view->isTakingFocus() && item) open(item);
  });
  connect(m_list, &QListWidget::itemActivated, this, &ConversationList::open);
  connect(m_list, &QListWidget::itemClicked, this, &ConversationList::open);
  connect(m_rename, &QPushButton::clicked, this, [this] {
    if (!m_list->currentItem()) return;
    // Wide enough for its title: without a minimum the dialog took the
    // width of its label and elided the title ("Renam… ation").
    QInputDialog dlg(this);
    dlg.setWindowTitle(tr("Rename conversation"));
    dlg.setLabelText(tr("Title:"));
    dlg.setTextValue(m_list->currentItem()->text());
    dlg.setMinimumWidth(dlg.fontMetrics().horizontalAdvance(dlg.windowTitle()) + 200);
    if (dlg.exec() == QDialog::Accepted) renameCurrent(dlg.textValue());
  });
  connect(m_delete, &QPushButton::clicked, this, &ConversationList::deleteCurrent);
  refresh();
}

void ConversationList::open(QListWidgetItem* item) {
  const qint64 id = item->data(Qt::UserRole).toLongLong();
  if (id != m_openId) emit conversationSelected(id);
}

void ConversationList::refresh() {
  const qint64 current = currentId();
  m_refreshing = true;  // rebuilding the list must not look like a user's selection
  m_list->clear();
  for (const ConversationRecord& c : m_store->conversations(m_search->text().trimmed())) {
    auto* item = new QListWidgetItem(c.title.isEmpty() ? tr("(untitled)") : c.title);
    item->setData(Qt::UserRole, c.id);
    item->setToolTip(c.updatedAt.toString(Qt::ISODate));
    m_list->addItem(item);
    if (c.id == current) m_list->setCurrentItem(item);
  }
  m_refreshing = false;
  m_rename->setEnabled(m_list->currentItem() != nullptr);
  m_delete->setEnabled(m_list->currentItem() != nullptr);
}

void ConversationList::setCurrent(qint64 id) {
  m_openId = id;
  m_refreshing = true;
  m_list->setCurrentItem(nullptr);
  for (int i = 0; i < m_list->count(); i++)
    if (m_list->item(i)->data(Qt::UserRole).toLongLong() == id) m_list->setCurrentRow(i);
  m_refreshing = false;
  m_rename->setEnabled(m_list->currentItem() != nullptr);
  m_delete->setEnabled(m_list->currentItem() != nullptr);
}

qint64 ConversationList::currentId() const {
  return m_list->currentItem() ? m_list->currentItem()->data(Qt::UserRole).toLongLong() : 0;
}

int ConversationList::count() const { return m_list->count(); }

bool ConversationList::renameCurrent(const QString& title) {
  const qint64 id = currentId();
  if (!id || title.trimmed().isEmpty()) return false;
  const bool ok = m_store->renameConversation(id, title.trimmed());
  refresh();
  return ok;
}

bool ConversationList::deleteCurrent() {
  const qint64 id = currentId();
  if (!id || !m_confirmDelete(m_list->currentItem()->text())) return false;
  const bool ok = m_store->deleteConversation(id);
  refresh();
  if (ok) emit conversationDeleted(id);
  return ok;
}

}  // namespace phaselab::ui
