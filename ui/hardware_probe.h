// HardwareProbe: the machine's peaks the phase meter divides by. Measured
// once (about half a second) and cached in QSettings.
#pragma once

namespace phaselab::ui {

struct HardwarePeaks {
  double memoryBandwidth = 0;  // bytes/s, all cores reading a 256 MiB buffer
  double peakFlops = 0;        // FP32 FLOP/s, all cores running independent FMAs
  // 8-bit integer multiply-adds (2 ops each) per second with the instructions
  // the fast CPU backend uses (AVX-512 VNNI, AVX-VNNI or AVX2); 0 if unknown.
  double peakInt8Ops = 0;
  int threads = 0;
  bool valid() const { return memoryBandwidth > 0 && peakFlops > 0; }
};

class HardwareProbe {
 public:
  // Runs the probes; call off the GUI thread.
  static HardwarePeaks measure(int threads = 0);
  static HardwarePeaks cached();  // invalid when never measured
  static void store(const HardwarePeaks& peaks);
};

}  // namespace phaselab::ui
