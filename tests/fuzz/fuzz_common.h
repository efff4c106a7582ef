// Shared by the fuzz targets: a check that stays on in every build type
// (a failed one is a finding, kept by libFuzzer like a crash).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "phaselab/tokenizer.h"

#define FUZZ_CHECK(cond)                                                                       \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond);     \
      std::abort();                                                                             \
    }                                                                                           \
  } while (0)

namespace phaselab::fuzz {

inline bool valid_utf8(std::string_view s) { return utf8_complete_prefix(s) == s.size(); }

}  // namespace phaselab::fuzz
