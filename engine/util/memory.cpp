#include "phaselab/memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

namespace phaselab {

namespace {
// The "<key> <n> kB" line of a /proc file, in bytes; 0 when absent.
uint64_t proc_kib_field(const char* path, const char* key) {
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char line[256];
  const size_t n = std::strlen(key);
  uint64_t kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, n) == 0) {
      kib = std::strtoull(line + n, nullptr, 10);
      break;
    }
  std::fclose(f);
  return kib * 1024;
}
}  // namespace

uint64_t available_memory_bytes() { return proc_kib_field("/proc/meminfo", "MemAvailable:"); }

uint64_t resident_memory_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<uint64_t>(resident) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

uint64_t peak_resident_memory_bytes() { return proc_kib_field("/proc/self/status", "VmHWM:"); }

bool reset_peak_resident_memory() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

Status check_memory(const MemoryNeed& need, uint64_t available, std::string_view hint) {
  if (available == 0 || need.total() <= available) return Status::ok();
  auto mib = [](uint64_t b) { return std::to_string((b + (1 << 20) - 1) >> 20); };
  std::string parts;  // the parts the need has
  for (const auto& [name, bytes] : {std::pair{"weights ", need.weights}, {"KV cache ", need.kv}, {"work buffers ", need.work}})
    if (bytes > 0) parts += (parts.empty() ? "" : ", ") + std::string(name) + mib(bytes);
  std::string what(hint);
  if (what.empty())
    what = need.kv > need.weights ? "lower the context size (-c)" : "use a smaller model or a smaller context size (-c)";
  return out_of_memory("this needs about " + mib(need.total()) + " MiB of memory (" + parts + ") and " + mib(available) +
                       " MiB are available: " + what);
}

}  // namespace phaselab
