#include "gguf_output.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "phaselab/files.h"

namespace phaselab::gguf_out {

Status check_output(const std::string& in, const std::string& out, bool overwrite) {
  struct stat si{}, so{};
  if (::stat(in.c_str(), &si) != 0) return io_error(in + ": cannot open");
  if (::stat(out.c_str(), &so) != 0) return Status::ok();  // a new file
  if (same_file(in, out))
    return invalid_argument(out + " is the input file itself (or a link to it): write to another file");
  if (!S_ISREG(so.st_mode)) return invalid_argument(out + " exists and is not a regular file");
  if (!overwrite) return invalid_argument(out + " exists: pass --force to replace it");
  return Status::ok();
}

std::string temp_path_beside(const std::string& out) {
  std::string pattern = out + ".partial-XXXXXX";
  const int fd = ::mkstemp(pattern.data());
  if (fd < 0) return {};
  ::close(fd);
  return pattern;
}

Status publish(const std::string& tmp, const std::string& out) {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(tmp.c_str(), 0666 & ~mask);
  if (std::rename(tmp.c_str(), out.c_str()) != 0) return io_error(out + ": cannot rename the finished file into place");
  return Status::ok();
}

}  // namespace phaselab::gguf_out
