"""A small torch CUDA extension for rig's build and audit tests: out = alpha * x + y.

It pins the torch it was built against, as kernel packages do, so an audit
against another torch can fail on the pin as well as on symbols.
"""
import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="rig-scale-ext",
    version="0.1.0",
    packages=["rig_scale_ext"],
    # the host half without optimisation or debug info (the interpreter's own flags carry -O3 -g): torch's
    # headers make it the build's one slow step, and the tests read symbols, archs and libraries, not speed
    ext_modules=[CUDAExtension("rig_scale_ext._C", ["scale.cpp", "scale_kernel.cu"],
                               extra_compile_args={"cxx": ["-O0", "-g0"], "nvcc": []})],
    cmdclass={"build_ext": BuildExtension},
    install_requires=[f"torch=={torch.__version__.split('+')[0]}"],
)
