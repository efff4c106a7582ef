// The application's identity on the desktop: the desktop file it is launched
// from (which ties its windows to the launcher and the icon) and its icon,
// drawn from the SVG embedded from resources/phaselab.qrc.
#pragma once

#include <QIcon>

namespace phaselab::ui {

// "io.github.phaselab.PhaseLab": the desktop file, the icon, the MIME package
// and the AppStream metainfo are all named by it (resources/).
QString appId();
// The icon at the sizes a desktop asks for, rendered from the embedded SVG
// (no image-format plugin needed).
QIcon appIcon();
// Sets the desktop file name and the window icon of the QApplication.
void applyAppIdentity();

}  // namespace phaselab::ui
