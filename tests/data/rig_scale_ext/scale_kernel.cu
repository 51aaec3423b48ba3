// The device half: a plain CUDA kernel and its launcher, no torch headers, so that nvcc compiles it for each
// arch in seconds.
#include <cstdint>
#include <cuda_runtime.h>

__global__ void scale_add_kernel(const float* x, const float* y, float* out, float alpha, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = alpha * x[i] + y[i];
}

void launch_scale_add(const float* x, const float* y, float* out, float alpha, int64_t n, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = (n + threads - 1) / threads;
  scale_add_kernel<<<blocks, threads, 0, stream>>>(x, y, out, alpha, n);
}
