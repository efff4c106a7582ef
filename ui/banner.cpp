#include "banner.h"

#include <QHBoxLayout>
#include <QLabel>
#include <QToolButton>

namespace phaselab::ui {

Banner::Banner(const QColor& background, QWidget* parent) : QFrame(parent) {
  setFrameShape(QFrame::StyledPanel);
  setAutoFillBackground(true);
  QPalette pal = palette();
  pal.setColor(QPalette::Window, background);
  pal.setColor(QPalette::WindowText, Qt::black);
  setPalette(pal);
  auto* l = new QHBoxLayout(this);
  l->setContentsMargins(8, 4, 4, 4);
  m_text = new QLabel;
  m_text->setWordWrap(true);
  m_text->setTextInteractionFlags(Qt::TextSelectableByMouse);
  l->addWidget(m_text, 1);
  hide();
}

void Banner::setText(const QString& text) { m_text->setText(text); }

QString Banner::text() const { return m_text->text(); }

void Banner::addButton(QAbstractButton* button) { layout()->addWidget(button); }

QToolButton* Banner::addDismissButton(const QString& accessibleName) {
  auto* dismiss = new QToolButton;
  dismiss->setText(QStringLiteral("✕"));
  dismiss->setToolTip(tr("Dismiss"));
  if (!accessibleName.isEmpty()) dismiss->setAccessibleName(accessibleName);
  addButton(dismiss);
  return dismiss;
}

}  // namespace phaselab::ui
