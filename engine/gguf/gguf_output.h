// Writing a GGUF file that another one is made from (quantize_model.cpp,
// prune_model.cpp): the output is checked against the input, written to a
// temporary file beside it and renamed into place when complete, so that a
// crash or a full disk never leaves a half file under the final name.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "phaselab/status.h"

namespace phaselab::gguf_out {

// The output must not be the input (same file, through a symlink or a hard
// link too) and must not replace an existing file unless overwrite.
Status check_output(const std::string& in, const std::string& out, bool overwrite);
// OUT.partial-XXXXXX in OUT's folder (created, empty); "" when it cannot be.
std::string temp_path_beside(const std::string& out);
// tmp -> out with the mode a new file gets here (mkstemp made it 0600).
Status publish(const std::string& tmp, const std::string& out);

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}

}  // namespace phaselab::gguf_out
