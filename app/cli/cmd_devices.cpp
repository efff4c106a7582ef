// phaselab-cli devices [--measure] [--json]: the CPU (cores, cache, kernels in
// use, with --measure its peaks) and whether CUDA works.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "phaselab/backend.h"
#include "phaselab/machine.h"

namespace phaselab::cli {

int cmd_devices(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {{"--json", "", false}, {"--measure", "", false}, {"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli devices [--measure] [--json]\n"
                "  --measure  also measure the CPU's peaks (about a second): memory read bandwidth with every\n"
                "             physical core, FP32 FMA and int8 multiply-add throughput\n");
    return kExitOk;
  }
  const std::string isa = cpu_kernels_isa(backend_options_from_environment().cpu.isa_cap);  // PHASELAB_CPU_ISA caps it
  const int cores = physical_core_count();
  const std::size_t llc = last_level_cache_bytes();
  const bool measure = args->has("--measure");
  const MachinePeaks peaks = measure ? measure_machine_peaks() : MachinePeaks{};
  const CudaProbe cuda = probe_cuda(backend_options_from_environment().cuda.library);
  if (args->has("--json")) {
    nlohmann::json j;
    j["cpu"] = {{"kernels", isa},
                {"threads", std::thread::hardware_concurrency()},
                {"physical_cores", cores},
                {"default_threads", default_thread_count()},
                {"llc_mib", llc / 1048576.0}};
    if (measure)
      j["cpu"]["peaks"] = {{"read_gbps", peaks.read_bandwidth / 1e9},
                           {"fp32_gflops", peaks.fp32_flops / 1e9},
                           {"int8_gops", peaks.int8_ops / 1e9},
                           {"threads", peaks.threads},
                           {"buffer_mib", peaks.buffer_bytes >> 20},
                           {"past_cache", peaks.past_cache},
                           {"llc_read_gbps", peaks.llc_read_bandwidth / 1e9},
                           {"llc_buffer_mib", peaks.llc_buffer_bytes >> 20},
                           {"runs", peaks.runs},
                           {"isa", peaks.isa},
                           {"plausible", peaks.plausible},
                           {"note", peaks.note}};
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
  std::printf("cpu    %d physical cores, %u hardware threads, last-level cache %s, kernels: %s\n", cores,
              std::thread::hardware_concurrency(), llc ? (std::to_string(llc >> 20) + " MiB").c_str() : "unknown",
              isa.c_str());
  if (measure) {
    std::printf("       %s\n", describe_machine_peaks(peaks).c_str());
    if (peaks.plausible && !peaks.note.empty()) std::printf("       note: %s\n", peaks.note.c_str());
  }
  if (cuda.available)
    std::printf("cuda   %s, peak %.0f GB/s, %.1f TFLOP/s FP32\n", cuda.description.c_str(), cuda.peak_gbps, cuda.peak_tflops);
  else
    std::printf("cuda   not available: %s\n", cuda.reason.c_str());
  return kExitOk;
}

}  // namespace phaselab::cli
