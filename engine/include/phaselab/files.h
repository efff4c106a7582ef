// File identity, for commands that write one file from another.
#pragma once

#include <sys/stat.h>

#include <string>

namespace phaselab {

// True when both paths exist and name one file (the same device and inode),
// reached through a symlink or a hard link too: writing `b` would then destroy
// `a`. Comparing the path strings would miss both links; stat() follows them.
inline bool same_file(const std::string& a, const std::string& b) {
  struct stat sa{}, sb{};
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace phaselab
