// Banner: a coloured strip above the chat for what the window cannot leave
// to the status bar (an error, a database that cannot be used, a base
// model), with the buttons that act on it at its right end. Hidden until
// shown.
#pragma once

#include <QColor>
#include <QFrame>

class QAbstractButton;
class QLabel;
class QToolButton;

namespace phaselab::ui {

class Banner : public QFrame {
  Q_OBJECT
 public:
  // tint: the banner's hue (red for an error, blue for a note). Its
  // background is the window's colour tinted with it and its text the
  // window's text colour, so it reads in a light and a dark theme alike;
  // both follow a theme change.
  explicit Banner(const QColor& tint, QWidget* parent = nullptr);
  static QColor background(const QColor& tint, const QPalette& palette);

  void setText(const QString& text);  // rich text allowed
  QString text() const;
  // A button after the text and the buttons added before it.
  void addButton(QAbstractButton* button);
  // The ✕ that dismisses the banner (the caller decides what that means);
  // accessibleName where "Dismiss" alone would not say what goes.
  QToolButton* addDismissButton(const QString& accessibleName = QString());

 private:
  void applyColors();

  QColor m_tint;
  QLabel* m_text = nullptr;
};

}  // namespace phaselab::ui
