#include "status_bar_labels.h"

#include <QFontMetrics>
#include <QLabel>
#include <QStatusBar>
#include <algorithm>

namespace phaselab::ui {

StatusBarLabels::StatusBarLabels(QStatusBar* bar, QWidget* window, bool notSaved)
    : QObject(window), m_bar(bar), m_window(window) {
  m_model = new QLabel(tr("No model"));
  m_model->setObjectName(QStringLiteral("modelLabel"));
  m_notSaved = new QLabel(tr("<b style='color:#b00020'>Not saved</b>"));
  m_notSaved->setObjectName(QStringLiteral("notSavedLabel"));
  m_notSaved->setToolTip(tr("The conversation database cannot be used: chats are kept in memory only."));
  m_notSaved->setVisible(notSaved);
  bar->addPermanentWidget(m_notSaved);
  // The API server's address while it serves (Settings > Servers).
  m_serve = new QLabel;
  m_serve->setObjectName(QStringLiteral("serveLabel"));
  m_serve->setTextInteractionFlags(Qt::TextSelectableByMouse);
  m_serve->setToolTip(tr("The loaded model is served over the OpenAI API to programs on this machine. The server "
                         "has its own KV cache (memory) and shares the CPU with the chat. Settings > Servers "
                         "turns it off."));
  m_serve->hide();
  bar->addPermanentWidget(m_serve);
  bar->addPermanentWidget(m_model);
  m_modelText = m_model->text();
  connect(bar, &QStatusBar::messageChanged, this, [this] { fit(); });
}

void StatusBarLabels::setModelText(const QString& text) {
  m_modelText = text;
  fit();
}

void StatusBarLabels::setNotSaved(bool notSaved) { m_notSaved->setVisible(notSaved); }

bool StatusBarLabels::isNotSavedShown() const { return m_notSaved->isVisibleTo(m_window); }

void StatusBarLabels::showServing(const QString& text) {
  m_serve->setText(text);
  m_serve->show();
}

void StatusBarLabels::hideServing() {
  m_serve->clear();
  m_serve->hide();
}

QString StatusBarLabels::servingText() const { return m_serve->isVisibleTo(m_window) ? m_serve->text() : QString(); }

void StatusBarLabels::fit() {
  const QString message = m_bar->currentMessage();
  const QFontMetrics fm(m_model->font());
  const int whole = fm.horizontalAdvance(m_modelText);
  int room = whole;
  if (!message.isEmpty()) {
    int others = 0;  // the other permanent labels, and the gaps between the parts
    for (QLabel* l : {m_notSaved, m_serve})
      if (l->isVisibleTo(m_window)) others += l->sizeHint().width() + 8;
    room = m_bar->width() - others - QFontMetrics(m_bar->font()).horizontalAdvance(message) - 40;
  }
  const bool elided = room < whole;
  m_model->setText(elided ? fm.elidedText(m_modelText, Qt::ElideRight, std::max(room, fm.horizontalAdvance(QStringLiteral("M…"))))
                          : m_modelText);
  m_model->setToolTip(elided ? m_modelText : QString());
}

}  // namespace phaselab::ui
