#pragma once

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
class Args;
int bench_batch_sweep(const Args& args);  // bench --batch
}  // namespace phaselab::cli
