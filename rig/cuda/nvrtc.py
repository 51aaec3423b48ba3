"""Run-time compile a kernel with NVRTC, loaded by soname.

Run as `python3 -m rig.cuda.nvrtc ARCH...` in a clean environment: the dynamic
loader must find libnvrtc.so.N and its builtins through ldconfig alone.
Prints one JSON object per arch.
"""
from __future__ import annotations

import ctypes
import sys

from rig.core.documents import dump_json

KERNEL = b'extern "C" __global__ void axpy(float a, const float *x, float *y)' \
         b' { int i = blockIdx.x * blockDim.x + threadIdx.x; y[i] += a * x[i]; }'


def sm_name(arch: str) -> str:
    """'12.0a' -> 'sm_120a'"""
    whole, _, rest = arch.partition(".")
    return f"sm_{whole}{rest}"


def compile_for(lib: ctypes.CDLL, arch: str) -> dict:
    prog = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(prog), KERNEL, b"probe.cu", 0, None, None)
    if status:
        return {"arch": arch, "ok": False, "error": f"nvrtcCreateProgram returned {status}"}
    opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={sm_name(arch)}".encode())
    status = lib.nvrtcCompileProgram(prog, 1, opts)
    size = ctypes.c_size_t()
    if status == 0:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    log_size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if status or not size.value:
        return {"arch": arch, "ok": False,
                "error": f"compile failed ({status}): {log.value.decode(errors='replace').strip()}"}
    return {"arch": arch, "ok": True, "cubin_bytes": size.value}


def main(argv: list[str]) -> int:
    soname, archs = argv[0], argv[1:]
    try:
        lib = ctypes.CDLL(soname)
    except OSError as exc:
        print(dump_json({"ok": False, "error": str(exc)}, "the answer"))
        return 1
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    results = [dict(compile_for(lib, a), nvrtc=f"{major.value}.{minor.value}") for a in archs]
    print(dump_json({"ok": all(r["ok"] for r in results), "results": results}, "the answer"))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
