// Logging through spdlog: a console sink (warnings and up by default) and a
// rotating log file in the user's data folder.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace phaselab {

// The user's data folder: $XDG_DATA_HOME/PhaseLab or ~/.local/share/PhaseLab.
std::string user_data_dir();
// The user's cache folder: $XDG_CACHE_HOME/PhaseLab or ~/.cache/PhaseLab.
std::string user_cache_dir();
// The model folder: <user_data_dir>/models (PHASELAB_MODEL_DIR overrides).
std::string user_model_dir();
// A text PhaseLab ships (resources/text/NAME, e.g. "eval-en.txt"):
// share/phaselab/text/ beside the running executable's bin/ once installed or
// unpacked, else the source tree the binary was built from. Empty when
// neither has it.
std::string bundled_text_path(const std::string& name);

// Sets up the default logger once. level: "trace".."off" for the console;
// the file always gets info and up. Safe to call more than once.
void init_logging(const std::string& console_level = "warn", bool to_file = true);
// Where the log file is (empty when file logging could not start).
std::string log_file_path();

}  // namespace phaselab
