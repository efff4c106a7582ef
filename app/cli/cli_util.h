// Small helpers shared by the phaselab-cli commands: argument parsing and the
// exit-code contract (0 success, 2 bad input with a one-line error, 1 other).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "phaselab/machine.h"
#include "phaselab/status.h"

namespace phaselab::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

struct OptionSpec {
  std::string long_name;   // "--model"
  std::string short_name;  // "-m" or ""
  bool takes_value = false;
};

class Args {
 public:
  // Parses argv (after the command name). Unknown options are errors.
  static Result<Args> parse(int argc, char** argv, const std::vector<OptionSpec>& specs);

  bool has(const std::string& long_name) const { return values_.count(long_name) > 0; }
  std::optional<std::string> get(const std::string& long_name) const;
  std::string get_or(const std::string& long_name, const std::string& def) const;
  Result<int> get_int(const std::string& long_name, int def, int min, int max) const;
  Result<double> get_double(const std::string& long_name, double def, double min, double max) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// Prints "phaselab-cli: <message>" on one line to stderr and returns the exit
// code for the status (2 for bad input / bad files / unsupported, else 1).
int report(const Status& st);
int usage_error(const std::string& message);

// Reads a whole regular file (for --file) of at most kMaxTextFileBytes;
// errors name the path (a folder, a FIFO or a device is refused at once).
constexpr long long kMaxTextFileBytes = 64ll << 20;
Result<std::string> read_text_file(const std::string& path);

// "a,,b," -> {"a", "b"}: the items of a comma-separated option, empty ones dropped.
std::vector<std::string> split_commas(const std::string& s);

// The process's peak resident set in MiB since the last
// reset_peak_resident_memory() (bench resets it after the machine peaks'
// 512 MiB probe), or since it started where the reset is refused.
double peak_rss_mib();

// bench's machine peaks (phaselab/machine.h), measured before the model
// runs (anything running beside the probe lowers its figures): on a CPU
// backend unless skip (--no-peaks), else none (a GPU has its own peak). The
// probe's note goes to stderr, and the peak RSS is reset after it.
MachinePeaks measure_bench_peaks(const std::string& backend, bool skip);
// One line on stderr when more threads are asked for than the machine has.
void warn_if_oversubscribed(int threads);

}  // namespace phaselab::cli
