// HardwareProbe: the machine's peaks the phase meter divides by, measured by
// the engine (phaselab/machine.h: all physical cores, SIMD reads in four
// streams a thread of a buffer of 4x the last-level cache and at least 512
// MiB, best of several passes)
// and cached in QSettings. A doubtful measurement is kept (to say why) but
// never divided by: usable() is false and the window measures again.
#pragma once

#include <QString>

namespace phaselab::ui {

struct HardwarePeaks {
  double memoryBandwidth = 0;  // bytes/s read from memory (DRAM), all physical cores, best pass
  double llcBandwidth = 0;     // bytes/s read from half the last-level cache; 0 if not measured
  double peakFlops = 0;        // FP32 FLOP/s, all physical cores running independent FMAs
  // 8-bit integer multiply-adds (2 ops each) per second with the instructions
  // the fast CPU backend uses (AVX-512 VNNI, AVX-VNNI or AVX2); 0 if unknown.
  double peakInt8Ops = 0;
  int threads = 0;
  quint64 llcBytes = 0;      // last-level cache; 0 if unknown
  quint64 bufferBytes = 0;   // what the memory passes read
  quint64 llcBufferBytes = 0;  // what the cache passes read
  bool pastCache = true;     // the memory buffer was 4x the last-level cache (else the note says why not)
  int runs = 0;              // bandwidth passes (the best counts)
  bool plausible = true;     // false: a figure looked wrong when measured (see note)
  QString note;              // why, or that the buffer was smaller; empty when fine
  bool valid() const { return memoryBandwidth > 0 && peakFlops > 0; }
  bool usable() const { return valid() && plausible; }  // what the meter may divide by
};

class HardwareProbe {
 public:
  // Bumped whenever the method changes: cached peaks of another version are
  // discarded (cached() is invalid) so they are measured again.
  // 3: the buffer is sized from the last-level cache; the cache's own figure.
  // 4: four streams a thread.
  static constexpr int kVersion = 4;

  // Runs the probes (about a second); call off the GUI thread and not while a
  // model is generating. threads 0: one per physical core.
  static HardwarePeaks measure(int threads = 0);
  static HardwarePeaks cached();  // invalid when never measured or measured by an older method
  static void store(const HardwarePeaks& peaks);
};

}  // namespace phaselab::ui
