// phaselab-cli devices [--json]: the CPU kernels in use and whether CUDA works.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/backend.h"

namespace phaselab::cli {

int cmd_devices(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {{"--json", "", false}, {"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli devices [--json]\n");
    return kExitOk;
  }
  const std::string isa = cpu_kernels_isa();
  const CudaProbe cuda = probe_cuda();
  if (args->has("--json")) {
    nlohmann::json j;
    j["cpu"] = {{"kernels", isa}, {"threads", std::thread::hardware_concurrency()}};
    j["cuda"] = {{"available", cuda.available},
                 {"description", cuda.description},
                 {"reason", cuda.reason},
                 {"peak_gbps", cuda.peak_gbps},
                 {"peak_tflops_fp32", cuda.peak_tflops},
                 {"total_mib", cuda.total_mem >> 20},
                 {"free_mib", cuda.free_mem >> 20}};
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("cpu    %u hardware threads, kernels: %s\n", std::thread::hardware_concurrency(), isa.c_str());
  if (cuda.available)
    std::printf("cuda   %s, peak %.0f GB/s, %.1f TFLOP/s FP32\n", cuda.description.c_str(), cuda.peak_gbps, cuda.peak_tflops);
  else
    std::printf("cuda   not available: %s\n", cuda.reason.c_str());
  return kExitOk;
}

}  // namespace phaselab::cli
