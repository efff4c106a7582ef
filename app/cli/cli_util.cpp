#include "cli_util.h"

#include "phaselab/memory.h"
#include "phaselab/thread_pool.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sstream>

namespace phaselab::cli {

Result<Args> Args::parse(int argc, char** argv, const std::vector<OptionSpec>& specs) {
  Args a;
  bool only_positional = false;
  for (int i = 0; i < argc; i++) {
    std::string arg = argv[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-' || (arg[1] >= '0' && arg[1] <= '9')) {
      a.positional_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    std::string value;
    bool inline_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    const OptionSpec* spec = nullptr;
    for (const auto& s : specs)
      if (arg == s.long_name || (!s.short_name.empty() && arg == s.short_name)) spec = &s;
    if (!spec) return invalid_argument("unknown option '" + arg + "' (see --help)");
    if (spec->takes_value) {
      if (!inline_value) {
        if (i + 1 >= argc) return invalid_argument("option " + spec->long_name + " needs a value");
        value = argv[++i];
      }
    } else if (inline_value) {
      return invalid_argument("option " + spec->long_name + " takes no value");
    }
    a.values_[spec->long_name] = value;
  }
  return a;
}

std::optional<std::string> Args::get(const std::string& long_name) const {
  auto it = values_.find(long_name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& long_name, const std::string& def) const {
  return get(long_name).value_or(def);
}

Result<int> Args::get_int(const std::string& long_name, int def, int min, int max) const {
  auto v = get(long_name);
  if (!v) return def;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno == ERANGE || x < min || x > max)
    return invalid_argument(long_name + " must be an integer from " + std::to_string(min) + " to " +
                            std::to_string(max) + " (got '" + *v + "')");
  return static_cast<int>(x);
}

Result<double> Args::get_double(const std::string& long_name, double def, double min, double max) const {
  auto v = get(long_name);
  if (!v) return def;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno == ERANGE || !(x >= min && x <= max)) {
    std::ostringstream os;
    os << long_name << " must be a number from " << min << " to " << max << " (got '" << *v << "')";
    return invalid_argument(os.str());
  }
  return x;
}

int report(const Status& st) {
  std::string msg = st.message();
  for (auto& c : msg)
    if (c == '\n') c = ' ';
  std::fprintf(stderr, "phaselab-cli: error: %s\n", msg.c_str());
  switch (st.code()) {
    case StatusCode::invalid_argument:
    case StatusCode::invalid_file:
    case StatusCode::unsupported:
    case StatusCode::io_error:
    case StatusCode::context_full:
    case StatusCode::out_of_memory: return kExitBadInput;
    default: return kExitFailure;
  }
}

int usage_error(const std::string& message) { return report(invalid_argument(message)); }

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(',', start);
    std::string part = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!part.empty()) out.push_back(part);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

Result<std::string> read_text_file(const std::string& path) {
  // Regular files only: a FIFO would block forever, /dev/zero never ends, a
  // folder reads as nothing.
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return invalid_argument(path + " is a folder, not a text file");
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + " is not a regular file (a pipe or a device?): give a text file");
  if (st.st_size > kMaxTextFileBytes)
    return invalid_argument(path + " is " + std::to_string(st.st_size >> 20) + " MiB; text files are read up to " +
                            std::to_string(kMaxTextFileBytes >> 20) + " MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path + ": cannot open: " + std::strerror(errno));
  std::string text(static_cast<size_t>(st.st_size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

MachinePeaks measure_bench_peaks(const std::string& backend, bool skip) {
  MachinePeaks peaks;
  if (backend.rfind("cpu", 0) != 0 || skip) return peaks;
  peaks = measure_machine_peaks();
  if (!peaks.note.empty()) std::fprintf(stderr, "phaselab-cli: machine peaks: %s\n", peaks.note.c_str());
  // The probe's buffer is freed: the peak RSS reported is the model's.
  reset_peak_resident_memory();
  return peaks;
}

void warn_if_oversubscribed(int threads) {
  if (const std::string w = thread_count_warning(threads); !w.empty())
    std::fprintf(stderr, "phaselab-cli: warning: %s\n", w.c_str());
}

double peak_rss_mib() {
  if (const uint64_t hwm = peak_resident_memory_bytes()) return hwm / 1048576.0;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux reports KiB
}

}  // namespace phaselab::cli
