#pragma once

#include <vector>

namespace phaselab::cli {
// Each takes the arguments after the command name and returns the exit code.
int cmd_info(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_generate(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_devices(int argc, char** argv);
int cmd_twin(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_compare(int argc, char** argv);
int cmd_batch(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_loadtest(int argc, char** argv);
int cmd_pull(int argc, char** argv);
int cmd_prune(int argc, char** argv);
class Args;
struct OptionSpec;
int bench_batch_sweep(const Args& args);  // bench --batch
int bench_serving(const Args& args);      // bench --serving (cmd_bench_serving.cpp)
const std::vector<OptionSpec>& serving_bench_options();
extern const char* const kServingBenchHelp[2];  // before and after kSchedulePolicyHelp
}  // namespace phaselab::cli
