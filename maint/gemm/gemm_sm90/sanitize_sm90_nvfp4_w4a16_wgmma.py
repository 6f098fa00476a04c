"""Small cases of every wgmma code path, checked against the FP32 reference, to run under
compute-sanitizer (sm_90 only):

    python maint/gemm/gemm_sm90/sanitize_sm90_nvfp4_w4a16_wgmma.py          # compile and check once
    compute-sanitizer --tool memcheck  python maint/gemm/gemm_sm90/sanitize_sm90_nvfp4_w4a16_wgmma.py
    compute-sanitizer --tool racecheck python maint/gemm/gemm_sm90/sanitize_sm90_nvfp4_w4a16_wgmma.py

The first run fills TileLang's kernel cache, so the sanitized runs time kernels, not compilers.
Exit status 1 if any case misses the reference, 2 without an sm_90 GPU; the sanitizer's summary says the rest.
"""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "gemm_sm120"))

import sm120_nvfp4_w4a16_streamk as maint  # noqa: E402

W, SK = maint.hopper.WgmmaConfig, maint.WgmmaStreamKConfig

# (M, N, K, config): both loaders, split-K, a producer warpgroup with one and two x blocks (the
# second partial), and stream-K whose CTAs refill a stage after storing a tile, with and without
# a producer. Shapes are small: racecheck tracks every shared-memory access.
SANITIZER_CASES = [
    (70, 256, 1024, W(64, 64, 3, 1)),  # cp.async loads, a partial x block
    (33, 256, 1024, W(64, 64, 3, 2)),  # split-K
    (150, 640, 512, W(160, 64, 4, 1, True, 2, True)),  # TMA, producer, two consumer warpgroups
    (300, 640, 1024, W(288, 64, 4, 1, True, 2, True)),  # two wgmmas per k16 step, a partial x block
    (70, 1280, 2048, SK(64, 64, 4, 2, True, 1, False, 0)),  # stream-K, two CTAs per SM
    (150, 1280, 1024, SK(160, 64, 4, 1, True, 2, True, 1)),  # stream-K over the leftover tiles, producer
]


def main() -> int:
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        print("the wgmma kernels run on sm_90 (H100/H200) only; no such GPU here", file=sys.stderr)
        return 2
    failed = 0
    for m, n, k, config in SANITIZER_CASES:
        result = maint.example.verify(m, n, k, config, linear=maint.nvfp4_w4a16_linear)
        print(f"M={m} N={n} K={k} {config}: {'ok' if result['ok'] else 'FAILED'}", flush=True)
        failed += not result["ok"]
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
