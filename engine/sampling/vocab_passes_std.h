// What vocab_passes.inc uses, included by each of its builds before that
// build's #pragma GCC target (see vocab_passes.inc).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "vocab_passes.h"
