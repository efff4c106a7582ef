// phaselab-fake-hub: the tests' stand-in for Hugging Face as a program, for
// screenshots of the Get Models dialog and for trying `phaselab-cli pull`
// without the internet:
//   phaselab-fake-hub [--delay-ms N] [--gguf FILE]
// prints "HF_ENDPOINT=http://127.0.0.1:PORT" and serves until SIGINT/SIGTERM.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

#include "hub/fake_hub.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  std::string gguf = PHASELAB_TEST_DATA "/stories260K.gguf";
  int delay_ms = 0;
  for (int i = 1; i < argc; i++) {
    if (!std::strcmp(argv[i], "--delay-ms") && i + 1 < argc) delay_ms = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gguf") && i + 1 < argc) gguf = argv[++i];
    else {
      std::fprintf(stderr, "usage: phaselab-fake-hub [--delay-ms N] [--gguf FILE]\n");
      return 2;
    }
  }
  try {
    phaselab::test::FakeHub hub(gguf);
    hub.set_delay_ms(delay_ms);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::printf("HF_ENDPOINT=%s\n", hub.endpoint().c_str());
    std::fflush(stdout);
    while (!g_stop) pause();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "phaselab-fake-hub: %s\n", e.what());
    return 1;
  }
  return 0;
}
