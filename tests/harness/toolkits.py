"""CUDA toolkit trees made here: each part (nvcc, the runtime headers, libcudart) saying the release it is
asked to, as rig.cuda.agreement reads them."""
from __future__ import annotations

from pathlib import Path


def toolkit(root: Path, nvcc: str | None, headers: int | None, cudart: str | None) -> Path:
    """A cuda-X.Y tree whose parts say NVCC (X.Y), HEADERS (CUDART_VERSION) and CUDART (libcudart's version)."""
    tree = root / "cuda-13.0"
    (tree / "bin").mkdir(parents=True)
    (tree / "include").mkdir()
    (tree / "lib64").mkdir()
    if nvcc:
        script = tree / "bin" / "nvcc"
        script.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {nvcc}, V{nvcc}.88'\n")
        script.chmod(0o755)
    if headers:
        (tree / "include" / "cuda_runtime_api.h").write_text(f"#pragma once\n#define CUDART_VERSION {headers}\n")
    if cudart:
        (tree / "lib64" / f"libcudart.so.{cudart}").write_bytes(b"\x7fELF")
        (tree / "lib64" / "libcudart.so.13").symlink_to(f"libcudart.so.{cudart}")
    return tree
