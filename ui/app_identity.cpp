#include "app_identity.h"

#include <QApplication>
#include <QPainter>
#include <QPixmap>
#include <QSvgRenderer>

// Q_INIT_RESOURCE must be called outside any namespace: the resources live in
// the static library phaselab_ui, whose initialiser the linker may drop.
static void initPhaseLabResources() { Q_INIT_RESOURCE(phaselab); }

namespace phaselab::ui {

QString appId() { return QStringLiteral(PHASELAB_APP_ID); }

QIcon appIcon() {
  initPhaseLabResources();
  QSvgRenderer svg(QStringLiteral(":/icons/phaselab.svg"));
  QIcon icon;
  if (!svg.isValid()) return icon;
  for (const int size : {16, 22, 24, 32, 48, 64, 128, 256}) {
    QPixmap pixmap(size, size);
    pixmap.fill(Qt::transparent);
    QPainter painter(&pixmap);
    painter.setRenderHint(QPainter::Antialiasing);
    svg.render(&painter);
    painter.end();
    icon.addPixmap(pixmap);
  }
  return icon;
}

void applyAppIdentity() {
  QGuiApplication::setDesktopFileName(appId());
  QApplication::setWindowIcon(appIcon());
}

}  // namespace phaselab::ui
