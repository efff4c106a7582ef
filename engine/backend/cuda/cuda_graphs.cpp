// The CUDA backend's passes as plain launches, or replayed from the CUDA graph
// captured for their batch-size bucket (decode).

#include "cuda_backend_impl.h"

namespace phaselab {

// parts_ as one pass of plain launches (no synchronisation: the caller
// copies the logits and waits).
Status CudaDevice::run_pass() {
  if (Status st = plan(0); !st.is_ok()) return after_sync(st);
  if (Status st = enqueue(pass_); !st.is_ok()) return after_sync(st);
  mark_written();
  return Status::ok();
}

// parts_ (one token each, last logits) through the graph captured for its
// bucket (captured on first use, and again after the device pool or the
// tables are reallocated); rows beyond the parts are padding. If capture
// fails, decoding continues with plain launches from then on, and the
// reason is logged.
Status CudaDevice::run_decode_graph() {
  const int bucket = bucket_for(static_cast<int>(parts_.size()));
  if (Status st = plan(bucket); !st.is_ok()) return after_sync(st);
  cudaGraphExec_t& exec = graphs_[bucket];
  if (!exec) {
    cudaGraph_t graph = nullptr;
    if (cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal); e != cudaSuccess)
      return after_sync(cuda_status(e, "cudaStreamBeginCapture", __FILE__, __LINE__));
    const Status st = enqueue(pass_);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    cudaError_t inst = cudaErrorUnknown;
    if (st.is_ok() && end == cudaSuccess) inst = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (!st.is_ok() || end != cudaSuccess || inst != cudaSuccess) {
      graphs_.erase(bucket);
      use_graph_ = false;
      (void)cudaGetLastError();  // clear the capture's error
      std::fprintf(stderr, "phaselab: CUDA graph capture failed (%s); decoding without graphs\n",
                   !st.is_ok() ? st.message().c_str() : cudaGetErrorString(end != cudaSuccess ? end : inst));
      return run_pass();
    }
  }
  if (cudaError_t e = cudaGraphLaunch(exec, stream_); e != cudaSuccess)
    return after_sync(cuda_status(e, "cudaGraphLaunch", __FILE__, __LINE__));
  mark_written();
  return Status::ok();
}

void CudaDevice::drop_graphs() {
  for (auto& [bucket, exec] : graphs_)
    if (exec) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace phaselab
