"""CUDA toolkit releases rig knows how to install.

NVIDIA publishes a `cuda-toolkit` meta-wheel per release whose extras pin the
component wheels of that release; rig resolves components through it instead of
keeping its own table of component versions.
"""

# toolkit release -> version of the cuda-toolkit meta-wheel on the package index
RELEASES = {
    "12.9.1": "12.9.1",
    "13.0.0": "13.0.0",
    "13.0.1": "13.0.1",
    "13.0.2": "13.0.2",
    "13.0.3": "13.0.3.0",
}

# extras of the cuda-toolkit meta-wheel; enough to compile and to JIT with NVRTC
COMPONENTS = ("nvcc", "cudart", "nvrtc", "cccl", "crt", "nvvm")


def series(version: str) -> str:
    """'13.0.2' -> '13.0', the name of the side-by-side tree (cuda-13.0)."""
    return ".".join(version.split(".")[:2])


def major(version: str) -> int:
    return int(version.split(".")[0])
