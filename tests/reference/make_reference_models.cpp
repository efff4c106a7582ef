// make_reference_models DIR: writes the reference models (reference_models.h)
// as DIR/<name>.gguf. Deterministic: the same files on every machine.
#include <QByteArray>
#include <QDir>
#include <QFile>

#include <cstdio>

#include "reference/reference_models.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_reference_models DIR\n");
    return 2;
  }
  const QString dir = QString::fromLocal8Bit(argv[1]);
  if (!QDir().mkpath(dir)) {
    std::fprintf(stderr, "cannot create %s\n", argv[1]);
    return 1;
  }
  for (const auto& m : phaselab::testing::reference_models()) {
    const std::string tmp = phaselab::testing::write_tiny_model(m.spec, "reference-" + m.name + ".gguf");
    const QString out = dir + "/" + QString::fromStdString(m.name) + ".gguf";
    QFile::remove(out);
    if (!QFile::copy(QString::fromStdString(tmp), out)) {
      std::fprintf(stderr, "cannot write %s\n", qPrintable(out));
      return 1;
    }
    QFile::remove(QString::fromStdString(tmp));
    std::printf("%s  (%s)\n", qPrintable(out), m.checks);
  }
  return 0;
}
