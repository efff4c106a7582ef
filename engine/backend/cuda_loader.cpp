// Loads the CUDA backend (libphaselab_cuda.so) at run time, so that the rest
// of PhaseLab neither links CUDA nor needs a GPU. Every way this can fail is
// turned into a reason the user can read; callers then fall back to the CPU.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>

#include "phaselab/backend.h"

namespace phaselab {

namespace {

using AbiFn = int (*)();
using ProbeFn = int (*)(char*, size_t, double*, double*, size_t*, size_t*);
using CreateFn = Backend* (*)(const std::shared_ptr<const Model>*, int, const CudaSwitches*, char*, size_t);

struct Library {
  void* handle = nullptr;  // kept open for the life of the process
  ProbeFn probe = nullptr;
  CreateFn create = nullptr;
  std::string error;
};

std::string executable_dir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

// The library at path (CudaSwitches::library), or the installed one for "":
// loaded at the first use of each and kept open for the life of the process.
const Library& library(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, Library> loaded;
  std::lock_guard<std::mutex> lock(mu);
  auto [it, fresh] = loaded.try_emplace(path);
  Library& lib = it->second;
  if (!fresh) return lib;
  std::vector<std::string> candidates;
  // A library named by the caller is the one to use (no fallback: whoever
  // names one, the tests of the CUDA emulator for one, wants that library).
  if (!path.empty()) {
    candidates.push_back(path);
    if (!std::filesystem::exists(path)) {
      lib.error = "the CUDA backend is not available (the CUDA library asked for, " + path +
                  ", does not exist: check PHASELAB_CUDA_LIB)";
      return lib;
    }
  } else {
    const std::string dir = executable_dir();
    candidates.push_back(dir + "/libphaselab_cuda.so");
    candidates.push_back(dir + "/../kernels/libphaselab_cuda.so");  // build tree: app/ and kernels/ side by side
    candidates.push_back(dir + "/../lib/phaselab/libphaselab_cuda.so");
    candidates.push_back("libphaselab_cuda.so");
  }
  std::string errors;
  for (const auto& c : candidates) {
    if (c.find('/') != std::string::npos && !std::filesystem::exists(c)) continue;
    void* h = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      errors += std::string(errors.empty() ? "" : "; ") + dlerror();
      continue;
    }
    auto abi = reinterpret_cast<AbiFn>(dlsym(h, "phaselab_cuda_abi"));
    lib.probe = reinterpret_cast<ProbeFn>(dlsym(h, "phaselab_cuda_probe"));
    lib.create = reinterpret_cast<CreateFn>(dlsym(h, "phaselab_cuda_create"));
    if (!abi || abi() != kCudaLibraryAbi || !lib.probe || !lib.create) {
      errors += "; " + c + " is not a compatible PhaseLab CUDA library";
      dlclose(h);
      lib.probe = nullptr;
      lib.create = nullptr;
      continue;
    }
    lib.handle = h;
    return lib;
  }
  lib.error = "the CUDA backend is not available (PhaseLab was built without CUDA, or " +
              std::string(errors.empty() ? "libphaselab_cuda.so was not found" : errors) + ")";
  return lib;
}

}  // namespace

CudaProbe probe_cuda(const std::string& library_path) {
  CudaProbe p;
  const Library& lib = library(library_path);
  if (!lib.handle) {
    p.reason = lib.error;
    return p;
  }
  char buf[512] = {0};
  p.available = lib.probe(buf, sizeof buf, &p.peak_gbps, &p.peak_tflops, &p.total_mem, &p.free_mem) == 1;
  (p.available ? p.description : p.reason) = buf;
  return p;
}

Result<std::unique_ptr<Backend>> make_cuda_backend(std::shared_ptr<const Model> model, int max_batch,
                                                   const CudaSwitches& sw) {
  if (!model) return invalid_argument("no model");
  if (max_batch < 1) return invalid_argument("batch size must be at least 1");
  const CudaProbe probe = probe_cuda(sw.library);
  if (!probe.available) return unsupported("CUDA: " + probe.reason);
  char err[1024] = {0};
  Backend* b = library(sw.library).create(&model, max_batch, &sw, err, sizeof err);
  if (!b) return Status(StatusCode::unsupported, std::string("CUDA: ") + err);
  return std::unique_ptr<Backend>(b);
}

}  // namespace phaselab
