// The serving benchmark's workload (phaselab/serving_bench.h) sent to any
// OpenAI-compatible server: PhaseLab's `serve`, llama-server, vLLM, a Dynamo
// deployment. Each chat stream is a thread of its own sending its requests
// one after another; each long request a thread that waits for its arrival
// time. Requests are streamed /v1/completions with ignore_eos and greedy
// sampling; a token's time is when its piece of text arrived (a piece the
// server sends holds a token or, rarely, a few).
#pragma once

#include "phaselab/remote_client.h"
#include "phaselab/serving_bench.h"

namespace phaselab {

// One run against ep (its model resolved by RemoteClient::connect). The row's
// policy and target are the URL; no KV transfer is known.
Result<ServingRow> run_serving_http(const RemoteEndpoint& ep, const ServingRun& run, const PromptSource& prompts,
                                    const ServingProgressFn& progress = {}, const std::atomic<bool>* cancel = nullptr);

}  // namespace phaselab
