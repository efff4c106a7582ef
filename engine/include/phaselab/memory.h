// What the machine's memory allows, asked before large allocations, so that
// "too little memory" is a clear refusal with the numbers instead of the
// kernel's out-of-memory killer (Linux overcommits: a vector of 40 GiB is
// "allocated" and then kills the process when it is touched).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "phaselab/status.h"

namespace phaselab {

// MemAvailable from /proc/meminfo (what can be allocated without swapping),
// or 0 when it cannot be read (then no check refuses anything).
uint64_t available_memory_bytes();

// The process's resident set size now (from /proc/self/statm), 0 if unknown.
uint64_t resident_memory_bytes();

// The kernel's peak resident set (VmHWM of /proc/self/status) in bytes, 0 if
// unknown; reset_peak_resident_memory() sets it to the current resident set
// ("5" > /proc/self/clear_refs, Linux 4.0+; false where that is refused), so
// that a measurement's peak leaves out what came before it (bench's 512 MiB
// bandwidth probe, an earlier model).
uint64_t peak_resident_memory_bytes();
bool reset_peak_resident_memory();

// What an allocation of `need` bytes is made of, for the message.
struct MemoryNeed {
  uint64_t weights = 0;  // model weights that will be resident
  uint64_t kv = 0;       // the KV cache
  uint64_t work = 0;     // activations, logits, scratch
  uint64_t total() const { return weights + kv + work; }
};

// out_of_memory with the numbers (the parts `need` has) and what to do
// when `need` exceeds `available` (available 0 = unknown: ok); hint, where
// given, says what to do instead of the engine's (a smaller model or
// context).
Status check_memory(const MemoryNeed& need, uint64_t available, std::string_view hint = {});

}  // namespace phaselab
