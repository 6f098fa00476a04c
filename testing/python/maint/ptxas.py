"""What ``ptxas -v`` says about a kernel's CUDA source: registers and spills, for the tests that
check a config's register budget (needs nvcc, not a GPU)."""

import pathlib
import subprocess
import tempfile

SM90_ARCH = "sm_90a"  # what the maint kernels compile sm_90 as


def ptxas_report(source: str, arch: str = SM90_ARCH) -> str:
    """``ptxas -v``'s report for ``source`` compiled for ``arch``."""
    from tilelang.contrib import nvcc

    with tempfile.TemporaryDirectory() as d:
        cu, cubin = pathlib.Path(d, "k.cu"), pathlib.Path(d, "k.cubin")
        cu.write_text(source)
        cmd = [nvcc.get_nvcc_compiler(), "--cubin", "-O3", f"-arch={arch}", *nvcc.default_compile_options(None)]
        done = subprocess.run([*cmd, "-Xptxas", "-v", "-o", str(cubin), str(cu)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr
