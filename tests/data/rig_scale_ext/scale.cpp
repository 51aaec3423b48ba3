// out = alpha * x + y on the current CUDA stream; float32, contiguous. The torch half, compiled by the host
// compiler alone: it needs torch's symbols (what an audit against another torch finds missing). Only the ATen
// and dispatcher headers it uses: torch/extension.h (all of torch's C++ API and pybind11) made this file 16
// CPU-seconds of a build, these 5.
#include <Python.h>  // first, as Python's documentation asks
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

void launch_scale_add(const float* x, const float* y, float* out, float alpha, int64_t n, cudaStream_t stream);

at::Tensor scale_add(const at::Tensor& x, const at::Tensor& y, double alpha) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "scale_add: tensors must be on a CUDA device");
  TORCH_CHECK(x.scalar_type() == at::kFloat && y.scalar_type() == at::kFloat, "scale_add: float32 only");
  TORCH_CHECK(x.sizes() == y.sizes(), "scale_add: x and y differ in shape");
  auto xc = x.contiguous(), yc = y.contiguous();
  auto out = at::empty_like(xc);
  if (xc.numel() > 0) {
    launch_scale_add(xc.data_ptr<float>(), yc.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(alpha),
                     xc.numel(), c10::cuda::getCurrentCUDAStream());
  }
  return out;
}

// The operator, registered with torch's dispatcher when the library loads (rig_scale_ext/__init__.py imports it).
TORCH_LIBRARY(rig_scale_ext, m) { m.def("scale_add(Tensor x, Tensor y, float alpha) -> Tensor"); }
TORCH_LIBRARY_IMPL(rig_scale_ext, CUDA, m) { m.impl("scale_add", &scale_add); }

// A Python module with nothing in it, so that `import rig_scale_ext._C` loads the library.
static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit__C() { return PyModule_Create(&module_def); }
