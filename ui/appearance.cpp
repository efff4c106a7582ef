#include "appearance.h"

#include <QApplication>
#include <QFontInfo>
#include <QPointer>
#include <QSettings>
#include <QStyle>
#include <QStyleFactory>
#include <algorithm>

#include "phaselab/log.h"

namespace phaselab::ui {

namespace {

const QString kThemeKey = QStringLiteral("appearance/theme");
const QString kFontKey = QStringLiteral("appearance/fontPointSize");

int clampPoints(int points) { return std::clamp(points, Appearance::kMinPointSize, Appearance::kMaxPointSize); }

// A font's size in points even when it was given in pixels.
int pointsOf(const QFont& font) { return font.pointSize() > 0 ? font.pointSize() : QFontInfo(font).pointSize(); }

void setStyleByName(const QString& name) {
  if (QApplication::style() && QApplication::style()->name().compare(name, Qt::CaseInsensitive) == 0) return;
  if (QStyle* style = QStyleFactory::create(name)) {
    QApplication::setStyle(style);  // the application owns it from here
  } else {
    spdlog::warn("appearance: the style '{}' is not available", name.toStdString());
  }
}

}  // namespace

QString themeName(Theme theme) {
  switch (theme) {
    case Theme::Light: return QStringLiteral("light");
    case Theme::Dark: return QStringLiteral("dark");
    case Theme::System: break;
  }
  return QStringLiteral("system");
}

Theme themeFromName(const QString& name) {
  if (name == QLatin1String("light")) return Theme::Light;
  if (name == QLatin1String("dark")) return Theme::Dark;
  return Theme::System;
}

Appearance::Appearance(QObject* parent) : QObject(parent) {
  m_startupStyle = QApplication::style() ? QApplication::style()->name() : QString();
  m_startupPalette = QApplication::palette();
  m_startupFont = QApplication::font();
  m_defaultPointSize = clampPoints(pointsOf(m_startupFont));
}

Appearance* Appearance::instance() {
  // Parented to the application, so it goes with it; the QPointer notices.
  static QPointer<Appearance> s_instance;
  if (!s_instance) s_instance = new Appearance(qApp);
  return s_instance;
}

int Appearance::fontPointSize() const { return pointsOf(QApplication::font()); }

bool Appearance::isDark(const QPalette& palette) { return palette.color(QPalette::Window).lightness() < 128; }

QPalette Appearance::darkPalette() {
  const QColor window(45, 45, 48), base(30, 30, 32), alternate(52, 52, 56), text(230, 230, 230),
      disabled(128, 128, 128), accent(66, 133, 244);
  QPalette p;
  p.setColor(QPalette::Window, window);
  p.setColor(QPalette::WindowText, text);
  p.setColor(QPalette::Base, base);
  p.setColor(QPalette::AlternateBase, alternate);
  p.setColor(QPalette::ToolTipBase, QColor(60, 60, 64));
  p.setColor(QPalette::ToolTipText, text);
  p.setColor(QPalette::PlaceholderText, QColor(150, 150, 150));
  p.setColor(QPalette::Text, text);
  p.setColor(QPalette::Button, QColor(58, 58, 62));
  p.setColor(QPalette::ButtonText, text);
  p.setColor(QPalette::BrightText, QColor(255, 100, 100));
  // Fusion draws bevels and frames from these.
  p.setColor(QPalette::Light, QColor(80, 80, 85));
  p.setColor(QPalette::Midlight, QColor(66, 66, 70));
  p.setColor(QPalette::Mid, QColor(40, 40, 42));
  p.setColor(QPalette::Dark, QColor(25, 25, 27));
  p.setColor(QPalette::Shadow, QColor(0, 0, 0));
  p.setColor(QPalette::Highlight, accent);
  p.setColor(QPalette::HighlightedText, Qt::white);
  p.setColor(QPalette::Link, QColor(110, 170, 255));
  p.setColor(QPalette::LinkVisited, QColor(170, 140, 255));
  for (QPalette::ColorRole role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText})
    p.setColor(QPalette::Disabled, role, disabled);
  p.setColor(QPalette::Disabled, QPalette::Highlight, QColor(80, 80, 85));
  p.setColor(QPalette::Disabled, QPalette::HighlightedText, disabled);
  return p;
}

QPalette Appearance::lightPalette() {
  // Fusion's own light palette, with Base and AlternateBase apart enough for
  // the chat's alternating messages.
  QPalette p;
  if (QStyle* fusion = QStyleFactory::create(QStringLiteral("Fusion"))) {
    p = fusion->standardPalette();
    delete fusion;
  }
  p.setColor(QPalette::Window, QColor(239, 239, 239));
  p.setColor(QPalette::WindowText, Qt::black);
  p.setColor(QPalette::Base, Qt::white);
  p.setColor(QPalette::AlternateBase, QColor(245, 245, 247));
  p.setColor(QPalette::Text, Qt::black);
  p.setColor(QPalette::ButtonText, Qt::black);
  p.setColor(QPalette::ToolTipBase, QColor(255, 255, 220));
  p.setColor(QPalette::ToolTipText, Qt::black);
  p.setColor(QPalette::PlaceholderText, QColor(110, 110, 110));
  return p;
}

void Appearance::setTheme(Theme theme) {
  m_theme = theme;
  switch (theme) {
    case Theme::Dark:
      setStyleByName(QStringLiteral("Fusion"));
      QApplication::setPalette(darkPalette());
      break;
    case Theme::Light:
      setStyleByName(QStringLiteral("Fusion"));
      QApplication::setPalette(lightPalette());
      break;
    case Theme::System:
      if (!m_startupStyle.isEmpty()) setStyleByName(m_startupStyle);
      QApplication::setPalette(m_startupPalette);
      break;
  }
  emit changed();
}

void Appearance::setPointSize(int points) {
  QFont f = m_startupFont;
  if (points > 0) f.setPointSize(clampPoints(points));
  QApplication::setFont(f);
  emit changed();
}

void applyTheme(Theme theme) {
  Appearance::instance()->setTheme(theme);
  QSettings().setValue(kThemeKey, themeName(theme));
}

void applyFontPointSize(int points) {
  const int clamped = clampPoints(points);
  Appearance::instance()->setPointSize(clamped);
  QSettings().setValue(kFontKey, clamped);
}

void increaseFontSize() { applyFontPointSize(Appearance::instance()->fontPointSize() + 1); }

void decreaseFontSize() { applyFontPointSize(Appearance::instance()->fontPointSize() - 1); }

void resetFontSize() {
  Appearance::instance()->setPointSize(0);
  QSettings().remove(kFontKey);
}

void loadAppearance() {
  Appearance* a = Appearance::instance();
  const QSettings s;
  const QString theme = s.value(kThemeKey).toString();
  if (!theme.isEmpty() && themeFromName(theme) == Theme::System && theme != QLatin1String("system"))
    spdlog::warn("appearance: unknown theme '{}' in the settings, using the system's", theme.toStdString());
  const Theme t = themeFromName(theme);
  // The system theme at start-up is what the application already has.
  if (t != Theme::System) a->setTheme(t);
  bool ok = false;
  const int points = s.value(kFontKey).toInt(&ok);
  if (ok && points > 0) a->setPointSize(points);
}

}  // namespace phaselab::ui
