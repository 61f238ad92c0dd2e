#!/usr/bin/env python3
"""Compiles shaders/cuda/infer.cu for sm_90 without nvcc or a GPU: NVRTC (CUDA C++ -> PTX) and
nvJitLink (PTX -> SASS) from PyPI's CUDA wheels, with build.sh's flags. Prints compile errors, or
each kernel's registers, shared memory and spills; --sass NAME disassembles kernel NAME (needs
cuobjdump, e.g. from the nvidia-cuda-cuobjdump wheel, on PATH or in the wheels' bin folder).
  pip install nvidia-cuda-nvrtc nvidia-nvjitlink nvidia-cuda-runtime [nvidia-cuda-cuobjdump]
  (CUDA 13's wheels keep cuda_fp16.h in nvidia-cuda-runtime, no longer beside NVRTC)
  python3 shaders/cuda/check.py [--sass attn_decode_g4] [--ptx FILE]
"""
import ctypes, glob, os, re, shutil, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))


def wheel_file(pattern):
    for root in sys.path:
        hits = sorted(glob.glob(os.path.join(root, "nvidia", "*", pattern)))
        if hits:
            return hits[-1]
    sys.exit(f"check.py: {pattern} not found; pip install nvidia-cuda-nvrtc nvidia-nvjitlink nvidia-cuda-runtime")


def main():
    nvrtc = ctypes.CDLL(wheel_file("lib/libnvrtc.so.*[0-9]"))
    jitlink = ctypes.CDLL(wheel_file("lib/libnvJitLink.so.*[0-9]"))
    include = os.path.dirname(wheel_file("include/cuda_fp16.h"))
    # NVRTC has no C library headers: the few names the kernels use from <stdint.h> / <math.h>.
    shim = tempfile.mkdtemp()
    with open(os.path.join(shim, "stdint.h"), "w") as f:
        f.write("#pragma once\n"
                "typedef signed char int8_t; typedef unsigned char uint8_t; typedef short int16_t;\n"
                "typedef unsigned short uint16_t; typedef int int32_t; typedef unsigned int uint32_t;\n"
                "typedef long long int64_t; typedef unsigned long long uint64_t;\n"
                "typedef unsigned long long uintptr_t; typedef long long intptr_t;\n"
                "#define INFINITY __int_as_float(0x7f800000)\n")
    src = open(os.path.join(here, "infer.cu"), "rb").read()
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"infer.cu", 0, None, None) == 0
    opts = [b"--gpu-architecture=compute_90", b"-std=c++17", b"-fmad=false", b"-default-device",
            b"-I" + here.encode(), b"-I" + include.encode(), b"-I" + shim.encode()]
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(log.value.decode(errors="replace") + "\ncheck.py: compilation failed")
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    if "--ptx" in sys.argv:  # the PTX, e.g. to show that a refactor leaves every kernel as it was
        open(sys.argv[sys.argv.index("--ptx") + 1], "wb").write(ptx.raw.rstrip(b"\0"))
    handle = ctypes.c_void_p()
    lopts = (ctypes.c_char_p * 3)(b"-arch=sm_90", b"-O3", b"-verbose")
    assert jitlink.nvJitLinkCreate(ctypes.byref(handle), 3, lopts) == 0
    assert jitlink.nvJitLinkAddData(handle, 2, ptx.raw, n.value, b"infer.ptx") == 0  # 2: PTX input
    rc = jitlink.nvJitLinkComplete(handle)
    size = ctypes.c_size_t()
    jitlink.nvJitLinkGetInfoLogSize(handle, ctypes.byref(size))
    info = ctypes.create_string_buffer(size.value + 1)
    jitlink.nvJitLinkGetInfoLog(handle, info)
    if rc != 0:
        jitlink.nvJitLinkGetErrorLogSize(handle, ctypes.byref(size))
        err = ctypes.create_string_buffer(size.value + 1)
        jitlink.nvJitLinkGetErrorLog(handle, err)
        sys.exit(err.value.decode(errors="replace") + "\ncheck.py: PTX to SASS failed")
    text = info.value.decode(errors="replace")
    for name, props in re.findall(r"Function properties for '([^']+)':\s*\ninfo\s*: (.*)", text):
        print(f"{name:28} {props}")
    if "--sass" in sys.argv:
        kernel = sys.argv[sys.argv.index("--sass") + 1]
        jitlink.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        jitlink.nvJitLinkGetLinkedCubin(handle, cubin)
        path = os.path.join(shim, "infer.cubin")
        open(path, "wb").write(cubin.raw)
        tool = shutil.which("cuobjdump") or wheel_file("bin/cuobjdump")
        subprocess.run([tool, "-sass", "-fun", kernel, path], check=True)


main()
