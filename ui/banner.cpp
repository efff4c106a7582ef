#include "banner.h"

#include <QApplication>
#include <QHBoxLayout>
#include <QLabel>
#include <QToolButton>

#include "appearance.h"

namespace phaselab::ui {

Banner::Banner(const QColor& tint, QWidget* parent) : QFrame(parent), m_tint(tint) {
  setFrameShape(QFrame::StyledPanel);
  setAutoFillBackground(true);
  applyColors();
  connect(Appearance::instance(), &Appearance::changed, this, &Banner::applyColors);
  auto* l = new QHBoxLayout(this);
  l->setContentsMargins(8, 4, 4, 4);
  m_text = new QLabel;
  m_text->setWordWrap(true);
  m_text->setTextInteractionFlags(Qt::TextSelectableByMouse);
  l->addWidget(m_text, 1);
  hide();
}

// A dark window takes more of the tint: a fifth of a hue on near-black is
// hardly a colour.
QColor Banner::background(const QColor& tint, const QPalette& palette) {
  const QColor window = palette.color(QPalette::Window);
  const double t = Appearance::isDark(palette) ? 0.32 : 0.2;
  return QColor::fromRgbF(static_cast<float>(window.redF() + (tint.redF() - window.redF()) * t),
                          static_cast<float>(window.greenF() + (tint.greenF() - window.greenF()) * t),
                          static_cast<float>(window.blueF() + (tint.blueF() - window.blueF()) * t));
}

// From the application's palette: the banner's own palette has these two
// roles set, so it would not follow a theme change by itself.
void Banner::applyColors() {
  const QPalette app = QApplication::palette();
  QPalette pal = palette();
  pal.setColor(QPalette::Window, background(m_tint, app));
  pal.setColor(QPalette::WindowText, app.color(QPalette::WindowText));
  setPalette(pal);
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
