#include "phaselab/log.h"

#include <spdlog/sinks/rotating_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <pwd.h>
#include <unistd.h>
#include <filesystem>
#include <mutex>

namespace phaselab {

namespace {
std::mutex g_mutex;
std::string g_log_path;
bool g_initialised = false;
}  // namespace

namespace {
// $XDG_<KIND>_HOME/PhaseLab, else <home>/<fallback>/PhaseLab, where home is
// $HOME or, without it (a service, `env -i`), the password database's home
// folder, never the current folder.
std::string xdg_dir(const char* xdg_var, const char* fallback) {
  if (const char* x = std::getenv(xdg_var); x && *x) return std::string(x) + "/PhaseLab";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/" + fallback + "/PhaseLab";
  if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir && *pw->pw_dir)
    return std::string(pw->pw_dir) + "/" + fallback + "/PhaseLab";
  return "/tmp/PhaseLab-" + std::to_string(::getuid());
}
}  // namespace

std::string user_data_dir() { return xdg_dir("XDG_DATA_HOME", ".local/share"); }

std::string user_cache_dir() { return xdg_dir("XDG_CACHE_HOME", ".cache"); }

std::string user_model_dir() {
  if (const char* m = std::getenv("PHASELAB_MODEL_DIR"); m && *m) return m;
  return user_data_dir() + "/models";
}

std::string bundled_text_path(const std::string& name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path p = exe.parent_path().parent_path() / "share" / "phaselab" / "text" / name;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
#ifdef PHASELAB_RESOURCE_SOURCE_DIR
  const fs::path src = fs::path(PHASELAB_RESOURCE_SOURCE_DIR) / "text" / name;
  if (fs::is_regular_file(src, ec)) return src.string();
#endif
  return {};
}

void init_logging(const std::string& console_level, bool to_file) {
  std::lock_guard lock(g_mutex);
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  console->set_level(spdlog::level::from_str(console_level));
  std::vector<spdlog::sink_ptr> sinks{console};
  g_log_path.clear();
  if (to_file) {
    try {
      const std::string dir = user_data_dir() + "/logs";
      std::filesystem::create_directories(dir);
      auto file = std::make_shared<spdlog::sinks::rotating_file_sink_mt>(dir + "/phaselab.log", 5 * 1024 * 1024, 3);
      file->set_level(spdlog::level::info);
      sinks.push_back(file);
      g_log_path = dir + "/phaselab.log";
    } catch (const std::exception&) {
      // A read-only home must not stop the program: console logging only.
    }
  }
  auto logger = std::make_shared<spdlog::logger>("phaselab", sinks.begin(), sinks.end());
  logger->set_level(spdlog::level::trace);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  // The file gets few lines (info and up): write each one out at once, so a
  // crash or a kill keeps the log, and whoever reads it sees it now.
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  g_initialised = true;
}

std::string log_file_path() {
  std::lock_guard lock(g_mutex);
  return g_log_path;
}

}  // namespace phaselab
