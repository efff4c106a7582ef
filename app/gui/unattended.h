// What the command line asks the open window to do: load the model it names,
// and, unattended (--prompt, --screenshot, --quit, --compare, --batch-sweep),
// send the prompt, run the comparison or the batch sweep, save the picture,
// print the answer or the rows, and exit with the run's status. This is how
// the README screenshots and the crash-recovery test drive the application.
#pragma once

#include <QObject>

#include "gui_options.h"

class QWidget;

namespace phaselab::ui {
class MainWindow;
}

class UnattendedRun : public QObject {
 public:
  // window and args outlive the run.
  UnattendedRun(phaselab::ui::MainWindow* window, const GuiArgs& args);

  // Connects to the window and starts: the model load, then what follows it.
  // False when the command line cannot be run (the reason printed): exit 2.
  bool start();
  // Non-zero when the run failed (a load, the answer, a picture, a compare).
  int exitCode() const { return m_exitCode; }

 private:
  // A failure is printed; with --quit it ends the run with status 1.
  void fail(const QString& message);
  // The end of a chat run: a moment for the last Markdown render and the
  // charts to repaint, then the screenshot, then exit when --quit.
  void finishChat();
  // After a compare or a batch sweep: the picture of that window, then exit.
  void finishWindow(QWidget* window);
  void saveScreenshot(QWidget* window);
  bool startCompare();
  bool startBatchSweep();

  phaselab::ui::MainWindow* m_window;
  const GuiArgs& m_args;
  int m_exitCode = 0;
};
