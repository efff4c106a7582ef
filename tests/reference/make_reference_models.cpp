// make_reference_models DIR: writes the reference models (reference_models.h)
// as DIR/<name>.gguf. Deterministic: the same files on every machine.
// make_reference_models --qwen3moe-twin LAYERS OUT: the Qwen3-30B-A3B shape
// twin of that many layers (docs/benchmarks.md); --gpt-oss-twin LAYERS OUT:
// gpt-oss-20b's.
#include <QByteArray>
#include <QDir>
#include <QFile>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "reference/reference_models.h"

int main(int argc, char** argv) {
  const bool oss = argc == 4 && std::string(argv[1]) == "--gpt-oss-twin";
  if (argc == 4 && (std::string(argv[1]) == "--qwen3moe-twin" || oss)) {
    const int layers = std::atoi(argv[2]), max_layers = oss ? 24 : 48;
    if (layers < 1 || layers > max_layers) {
      std::fprintf(stderr, "LAYERS: 1 to %d\n", max_layers);
      return 2;
    }
    const std::string tmp = phaselab::testing::write_tiny_model(
        oss ? phaselab::testing::gpt_oss_20b_twin(layers) : phaselab::testing::qwen3moe_30b_a3b_twin(layers),
        oss ? "gpt-oss-twin.gguf" : "qwen3moe-twin.gguf");
    QFile::remove(QString::fromLocal8Bit(argv[3]));
    if (!QFile::rename(QString::fromStdString(tmp), QString::fromLocal8Bit(argv[3])) &&
        !QFile::copy(QString::fromStdString(tmp), QString::fromLocal8Bit(argv[3]))) {
      std::fprintf(stderr, "cannot write %s\n", argv[3]);
      return 1;
    }
    QFile::remove(QString::fromStdString(tmp));
    std::printf("%s\n", argv[3]);
    return 0;
  }
  // (An option where DIR belongs, --help included, is not a folder to write into.)
  if (argc != 2 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: make_reference_models DIR | --qwen3moe-twin LAYERS OUT | --gpt-oss-twin LAYERS OUT\n");
    return argc == 2 && std::string(argv[1]) == "--help" ? 0 : 2;
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
