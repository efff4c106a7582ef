// Banner: a coloured strip above the chat for what the window cannot leave
// to the status bar (an error, a database that cannot be used, a base
// model), with the buttons that act on it at its right end. Hidden until
// shown.
#pragma once

#include <QFrame>

class QAbstractButton;
class QColor;
class QLabel;
class QToolButton;

namespace phaselab::ui {

class Banner : public QFrame {
  Q_OBJECT
 public:
  // The text is black on background, in either theme.
  explicit Banner(const QColor& background, QWidget* parent = nullptr);

  void setText(const QString& text);  // rich text allowed
  QString text() const;
  // A button after the text and the buttons added before it.
  void addButton(QAbstractButton* button);
  // The ✕ that dismisses the banner (the caller decides what that means);
  // accessibleName where "Dismiss" alone would not say what goes.
  QToolButton* addDismissButton(const QString& accessibleName = QString());

 private:
  QLabel* m_text = nullptr;
};

}  // namespace phaselab::ui
