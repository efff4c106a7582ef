// Appearance: light / dark / system theme and the application's font size,
// applied to the whole QApplication and kept in QSettings
// ("appearance/theme": system | light | dark; "appearance/fontPointSize":
// absent for the platform's size).
//
// Light and Dark use the Fusion style, whose drawing follows the palette on
// every platform (native styles may ignore it); System puts back the style,
// palette and font the application started with. Those are remembered the
// first time Appearance::instance() runs, so call loadAppearance() right after
// the QApplication is constructed, before anything else changes them.
//
// Widgets that read palette() or font() while painting follow a change on
// their own. Whatever copied a colour or a size at construction (chart
// brushes, a widget palette with a role set explicitly, a font with an
// explicit point size) must refresh on Appearance::changed().
#pragma once

#include <QFont>
#include <QObject>
#include <QPalette>
#include <QString>

namespace phaselab::ui {

enum class Theme { System, Light, Dark };

QString themeName(Theme theme);             // system | light | dark
Theme themeFromName(const QString& name);   // unknown: System

class Appearance : public QObject {
  Q_OBJECT
 public:
  static constexpr int kMinPointSize = 6;
  static constexpr int kMaxPointSize = 32;

  // Created on first use; needs a QApplication. Lives until the application
  // is destroyed.
  static Appearance* instance();

  Theme theme() const { return m_theme; }
  // The application font's size in points now, and the one it started with.
  int fontPointSize() const;
  int defaultPointSize() const { return m_defaultPointSize; }
  // A palette whose window is dark (the Dark theme, or a dark system theme):
  // for colours chosen by hand, such as chart series.
  static bool isDark(const QPalette& palette);

  static QPalette darkPalette();
  static QPalette lightPalette();

 signals:
  // After a theme or font size change, once the new palette and font are set.
  void changed();

 private:
  friend void applyTheme(Theme);
  friend void applyFontPointSize(int);
  friend void resetFontSize();
  friend void loadAppearance();
  explicit Appearance(QObject* parent);
  void setTheme(Theme theme);
  void setPointSize(int points);  // 0: the startup font

  Theme m_theme = Theme::System;
  QString m_startupStyle;
  QPalette m_startupPalette;
  QFont m_startupFont;
  int m_defaultPointSize = 10;
};

// Apply and save in QSettings.
void applyTheme(Theme theme);
// Clamped to [kMinPointSize, kMaxPointSize].
void applyFontPointSize(int points);
// One point up or down from the current size (Ctrl+= / Ctrl+-), clamped; back
// to the platform's size (Ctrl+0), which also drops the saved size.
void increaseFontSize();
void decreaseFontSize();
void resetFontSize();
// At start-up: apply what QSettings holds (nothing is written).
void loadAppearance();

}  // namespace phaselab::ui
