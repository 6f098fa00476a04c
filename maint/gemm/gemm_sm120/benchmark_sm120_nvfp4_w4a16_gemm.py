"""Benchmark: our NVFP4 W4A16 GEMM against BF16 cuBLAS and vLLM's Marlin NVFP4 kernel.

Method (DESIGN.md section 7):
- every call is replayed from a CUDA graph over at least 512 MB of rotated weight copies (several
  times any L2), each call followed by a small separator kernel whose own cost is measured in a graph
  of separators alone and subtracted;
- each (shape, M) cell runs 3 rounds, the method order rotating each round; the fastest round per
  cell is reported, and layer-weighted totals (time per model step) for the fastest and the median
  rounds;
- ``--verify`` checks ours and Marlin's output against the FP32 reference before timing;
- ``--sustained`` heats the GPU before every timing with SUSTAINED_HEAT_MS of the same method's
  calls: the H200 drops its clock under a long compute-bound load, and the default timing, a few
  milliseconds right after a pause, mostly sees the boost clock (see SUSTAINED_HEAT_MS);
- beside the GEMMs, ``read``: a kernel that only reads as many bytes as our weights hold, timed the
  same way. It is the floor this harness lets any kernel reach (the pipeline's ramp and tail, the
  launch), where ``floor`` is the bytes at the peak rate alone.

    python maint/gemm/gemm_sm120/benchmark_sm120_nvfp4_w4a16_gemm.py --verify --json r.json --plot r.png
    python maint/gemm/gemm_sm120/benchmark_sm120_nvfp4_w4a16_gemm.py --from-json r.json --plot r.png  # no GPU
"""

import argparse
import datetime
import json
import math
import statistics
import sys
import pathlib

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import sm120_nvfp4_w4a16_streamk as maint  # noqa: E402

nv = maint.example

DEFAULT_SHAPES = [(16384, 5120), (14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408)]
DEFAULT_LAYER_COUNTS = [48, 16, 64, 64, 64]  # per model step, a 27B-class model
DEFAULT_MS = [1, 4, 8, 16, 17, 24, 32, 33, 40, 48, 49, 56, 64, 72, 96, 104, 128, 144, 192, 208, 232, 256, 272,
              304, 384, 416, 512, 544, 608, 768, 832, 1024]  # fmt: skip
ROUNDS = 3
# The H200 ran 1980 MHz idle and 1590-1740 MHz within ~50 ms of back-to-back M = 1024 GEMMs (power
# capped; nvidia-smi every 20 ms, 2026-12-01). Replays timed then took 11-20 % longer than the first
# window (5120x17408: ours 224-233 us first, 260-268 after 0.3 s; cuBLAS 225 and 247), and the
# ranking of configs and methods changed. 200 ms of calls reach that state.
SUSTAINED_HEAT_MS = 200.0
BF16_FLOPS_PER_S = 790e12  # H200 BF16 dense math the floors are counted against


def weight_bytes(n: int, k: int) -> int:
    return int(n * k * nv.WEIGHT_BYTES_PER_CODE)


def floor_us(m: int, n: int, k: int) -> float:
    """The larger of the weight-read time at 4.46 TB/s and the BF16 math time at 790 TFLOP/s."""
    return max(weight_bytes(n, k) / nv.HBM_BYTES_PER_S, 2.0 * m * n * k / BF16_FLOPS_PER_S) * 1e6


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def step(self, label: str) -> None:
        self.done += 1
        width = 30
        filled = width * self.done // self.total
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label:<40}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


# The read floor's kernel: every thread XORs 16-byte loads strided over the grid, READ_UNROLL of them
# in flight. The fastest of eight variants on the H200 (2026-11-30j, 2 to 8 CTAs per SM of 256 or 512
# threads, 2 or 8 loads in flight; all within 5 % of each other on 17.7-100 MB: 4.01 TB/s on 100 MB).
READ_VECTOR = 4  # int32 per load: 16 bytes
READ_THREADS = 256
READ_CTAS_PER_SM = 4
READ_UNROLL = 2


def build_read_kernel(units: int, ctas: int):
    """A kernel that reads ``units`` 16-byte words and writes one XOR per thread to ``sink`` (so the
    loads are not dropped)."""
    import tilelang.language as T

    stride = ctas * READ_THREADS
    passes = math.ceil(units / (stride * READ_UNROLL))

    @T.prim_func
    def read(words: T.Tensor((units * READ_VECTOR,), "int32"), sink: T.Tensor((stride * READ_VECTOR,), "int32")):
        with T.Kernel(ctas, threads=READ_THREADS) as bx:
            tx = T.get_thread_binding()
            acc = T.alloc_local((READ_VECTOR,), "int32")
            for v in T.vectorized(READ_VECTOR):
                acc[v] = 0
            for p in T.serial(passes):
                for u in T.unroll(READ_UNROLL):
                    i = (p * READ_UNROLL + u) * stride + bx * READ_THREADS + tx
                    if i < units:
                        for v in T.vectorized(READ_VECTOR):
                            acc[v] = acc[v] ^ words[i * READ_VECTOR + v]
            for v in T.vectorized(READ_VECTOR):
                sink[(bx * READ_THREADS + tx) * READ_VECTOR + v] = acc[v]

    return read


def compile_read_kernel(units: int, ctas: int, arch: str):
    import tilelang

    return tilelang.compile(build_read_kernel(units, ctas), target={"kind": "cuda", "arch": arch})


def read_calls(nbytes: int, device: torch.device) -> list:
    """Calls that each read their own ``nbytes`` buffer (rotated like the weights) with the read kernel."""
    units = math.ceil(nbytes / (READ_VECTOR * 4))  # 16-byte words
    ctas = READ_CTAS_PER_SM * nv.sm_count(device)
    kernel = compile_read_kernel(units, ctas, nv.device_arch(device))
    sink = torch.empty(ctas * READ_THREADS * READ_VECTOR, dtype=torch.int32, device=device)
    buffers = [torch.zeros(units * READ_VECTOR, dtype=torch.int32, device=device) for _ in range(copies_for(nbytes))]
    return [lambda b=b: kernel(b, sink) for b in buffers]


def copies_for(bytes_per_copy: int) -> int:
    return max(2, math.ceil(nv.ROTATION_BYTES / bytes_per_copy))


def build_methods(n: int, k: int, dispatch: str):
    """``({name: (make_call(x, i), copies)}, checkpoint tensors, our weight, Marlin or None, our linear)``:
    each method rotates over its own weight copies; the rest is for ``--verify``."""
    linear = maint.nvfp4_w4a16_linear if dispatch == "tuned" else nv.nvfp4_w4a16_linear
    raw = [nv.random_nvfp4_weight(n, k, "cuda", torch.Generator().manual_seed(i)) for i in range(copies_for(weight_bytes(n, k)))]
    ours = [nv.prepare_nvfp4_weight(*r) for r in raw]
    methods = {"ours": (lambda x, i: lambda: linear(x, ours[i]), len(ours))}
    dense = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(copies_for(n * k * 2))]
    methods["cublas"] = (lambda x, i: lambda: torch.nn.functional.linear(x, dense[i]), len(dense))
    marlin = [nv.marlin_linear_or_none(*r) for r in raw]
    if marlin[0] is not None:
        methods["marlin"] = (lambda x, i: lambda: marlin[i](x), len(marlin))
    reads = read_calls(weight_bytes(n, k), torch.device("cuda"))
    methods["read"] = (lambda x, i: reads[i], len(reads))
    return methods, raw[0], ours[0], marlin[0], linear


def dispatched_configs(m: int, n: int, k: int, dispatch: str, device: torch.device) -> set:
    """The configs ``dispatch``'s linear launches for M rows (one per 1024-row chunk size)."""
    rows = {nv.MAX_M_PER_LAUNCH} if m >= nv.MAX_M_PER_LAUNCH else set()
    rows |= {m % nv.MAX_M_PER_LAUNCH} - {0}
    if dispatch == "tuned":
        return {maint.config_for(r, n, k, device) for r in rows}
    return {nv.get_config(r, n, k, sm_count=nv.sm_count(device)) for r in rows}


def run(shapes, layer_counts, ms, dispatch: str, verify: bool, on_cell=None, sustained: bool = False) -> dict:
    """Measure every (shape, M) cell; ``on_cell(result_so_far)`` after each (to save partial runs).
    The kernels the cells will launch are compiled first, in parallel (heuristic configs of untuned
    shapes would otherwise compile one at a time inside the run)."""
    device = torch.device("cuda")
    jobs = {(n, k, c) for n, k in shapes for m in ms for c in dispatched_configs(m, n, k, dispatch, device)}
    nv.precompile(jobs, nv.device_arch(device), maint.compile_any)
    separator_buffer = torch.zeros(1, device="cuda")
    separator = lambda: separator_buffer.add_(1.0)  # noqa: E731  (one tiny kernel between calls)
    cells = []
    result = {
        "meta": {
            "gpu": torch.cuda.get_device_name(),
            "key": maint.gpu_key(torch.device("cuda")),
            "dispatch": dispatch,
            "sustained": sustained,
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "method": f"CUDA-graph replay over >= {nv.ROTATION_BYTES >> 20} MB of rotated weights, separator subtracted, "
            f"{ROUNDS} rounds rotating the method order"
            + (f", each timing after {SUSTAINED_HEAT_MS:.0f} ms of the same calls (sustained)" if sustained else ""),
        },
        "cells": cells,
    }
    progress = Progress(len(shapes) * len(ms))
    for (n, k), layers in zip(shapes, layer_counts):
        methods, raw, ours_w, marlin_fn, linear = build_methods(n, k, dispatch)
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            cell = {"n": n, "k": k, "m": m, "layers": layers, "floor_us": floor_us(m, n, k), "rounds": {}}
            if verify:
                ref = nv.reference_nvfp4_linear(x, *raw)
                cell["verify"] = {"ours": nv.compare_with_reference(linear(x, ours_w), ref)}
                if marlin_fn is not None:
                    cell["verify"]["marlin"] = nv.compare_with_reference(marlin_fn(x), ref)
            timers = {name: nv.GraphTimer([make(x, i) for i in range(copies)], separator) for name, (make, copies) in methods.items()}
            cell["rounds"] = race(timers, heat_ms=SUSTAINED_HEAT_MS if sustained else 0.0)
            del timers
            cells.append(cell)
            progress.step(f"{n}x{k} M={m}")
            if on_cell is not None:
                on_cell(result)
        del methods
        torch.cuda.empty_cache()
    return result


def race(timers: dict, rounds: int = ROUNDS, heat_ms: float = 0.0) -> dict:
    """``{name: [us, one per round]}``: the timers, all captured beforehand, replayed back to back,
    each round starting one name later so that none always runs first (on a cool GPU) or last;
    each timing after ``heat_ms`` of its own calls when that is given (``--sustained``)."""
    names = list(timers)
    times: dict = {}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times.setdefault(name, []).append(timers[name].per_call_us(heat_ms=heat_ms))
    return times


def summarize(result: dict) -> dict:
    """Per M, layer-weighted step time per method for the fastest and the median round, and floors."""
    totals: dict = {}
    for cell in result["cells"]:
        t = totals.setdefault(cell["m"], {"floor": 0.0, "fastest": {}, "median": {}})
        t["floor"] += cell["layers"] * cell["floor_us"]
        for name, rounds in cell["rounds"].items():
            t["fastest"][name] = t["fastest"].get(name, 0.0) + cell["layers"] * min(rounds)
            t["median"][name] = t["median"].get(name, 0.0) + cell["layers"] * statistics.median(rounds)
    return dict(sorted(totals.items()))


M_BANDS = ((1, 16), (32, 96), (128, 256), (384, 1024))  # decode, small and large batches, prefill-sized


def marlin_ratios_by_band(result: dict) -> dict:
    """Per shape and M band, (min, median) over the band's cells of Marlin's time / ours (> 1: we are
    faster), fastest rounds. How a shape without a tuned entry fares under the heuristics."""
    bands: dict = {}
    for cell in result["cells"]:
        if "marlin" not in cell["rounds"]:
            continue
        for low, high in M_BANDS:
            if low <= cell["m"] <= high:
                ratio = min(cell["rounds"]["marlin"]) / min(cell["rounds"]["ours"])
                bands.setdefault((cell["n"], cell["k"]), {}).setdefault((low, high), []).append(ratio)
    return {
        shape: {band: (min(r), statistics.median(r)) for band, r in sorted(per_band.items())}
        for shape, per_band in bands.items()
    }


def print_report(result: dict) -> None:
    totals = summarize(result)
    names = list(next(iter(totals.values()))["fastest"])
    sustained = " (sustained)" if result["meta"].get("sustained") else ""
    print(f"\n{result['meta']['gpu']} ({result['meta']['key']}), dispatch={result['meta']['dispatch']}{sustained}: "
          "layer-weighted us per model step, fastest round (median round)")  # fmt: skip
    print("ours/X: X's time over ours (> 1: we are faster); read/ours: the share of the read floor we reach")
    print(f"{'M':>5} " + " ".join(f"{n:>18}" for n in names) + f" {'floor':>8} {'ours/marlin':>12} {'ours/cublas':>12} {'read/ours':>10}")
    for m, t in totals.items():
        row = f"{m:5d} " + " ".join(f"{t['fastest'][n]:9.0f} ({t['median'][n]:6.0f})" for n in names) + f" {t['floor']:8.0f}"
        for base, width in (("marlin", 12), ("cublas", 12), ("read", 10)):
            row += f" {t['fastest'][base] / t['fastest']['ours']:{width - 1}.2f}x" if base in t["fastest"] else f" {'n/a':>{width}}"
        print(row)
    if any("marlin" in c["rounds"] for c in result["cells"]):
        ratios = sorted((min(c["rounds"]["marlin"]) / min(c["rounds"]["ours"]), c["n"], c["k"], c["m"]) for c in result["cells"])
        print(f"worst cell against Marlin: {ratios[0][0]:.2f}x at {ratios[0][1]}x{ratios[0][2]} M={ratios[0][3]}; "
              f"cells where we lose: {[(n, k, m) for r, n, k, m in ratios if r < 1.0]}")  # fmt: skip
        print("against Marlin per shape and M band, min / median of the cells:")
        for (n, k), per_band in marlin_ratios_by_band(result).items():
            print(f"  {n}x{k}: " + "  ".join(f"M {lo}-{hi} {a:.2f}x / {b:.2f}x" for (lo, hi), (a, b) in per_band.items()))
    failed = [(c["n"], c["k"], c["m"], name) for c in result["cells"] for name, v in c.get("verify", {}).items() if not v["ok"]]
    if any("verify" in c for c in result["cells"]):
        print(f"verify: {'all cells pass' if not failed else 'FAILED ' + str(failed)}")


def plot(result: dict, path: str) -> None:
    """Layer-weighted time per model step against M, one line per method, log scales, the floor drawn in."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = summarize(result)
    ms = list(totals)
    fig, ax = plt.subplots(figsize=(8, 5))
    labels = {"read": "read only: our weight bytes, no math"}
    for name in next(iter(totals.values()))["fastest"]:
        ax.plot(ms, [totals[m]["fastest"][name] for m in ms], marker="o", markersize=3, label=labels.get(name, name))
    ax.plot(ms, [totals[m]["floor"] for m in ms], "k--", label="floor: weights at 4.46 TB/s or BF16 at 790 TFLOP/s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("M (rows per step)")
    ax.set_ylabel("layer-weighted time per model step (us)")
    ax.set_title(f"NVFP4 W4A16 GEMM, {result['meta']['gpu']}, dispatch={result['meta']['dispatch']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_shapes(text: str) -> list:
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatch", choices=["tuned", "example"], default="tuned")
    parser.add_argument("--shapes", type=parse_shapes, default=DEFAULT_SHAPES, help="NxK,NxK,... (default: a 27B-class model)")
    parser.add_argument("--layer-counts", type=lambda t: [int(v) for v in t.split(",")], default=None)
    parser.add_argument("--ms", type=lambda t: [int(v) for v in t.split(",")], default=DEFAULT_MS)
    parser.add_argument("--verify", action="store_true", help="check ours and Marlin against the FP32 reference")
    parser.add_argument("--sustained", action="store_true", help=f"time each call after {SUSTAINED_HEAT_MS:.0f} ms of the same calls (clocks under load)")
    parser.add_argument("--json", help="write every cell and round here")
    parser.add_argument("--plot", help="write the layer-weighted plot here (PNG)")
    parser.add_argument("--from-json", help="report and plot an earlier run instead of measuring (no GPU needed)")
    args = parser.parse_args(argv)
    if args.from_json:
        result = json.loads(pathlib.Path(args.from_json).read_text())
    else:
        if not torch.cuda.is_available():
            parser.error("needs a CUDA GPU (use --from-json to report an earlier run)")
        layer_counts = args.layer_counts or (DEFAULT_LAYER_COUNTS if args.shapes == DEFAULT_SHAPES else [1] * len(args.shapes))
        if len(layer_counts) != len(args.shapes):
            parser.error("--layer-counts needs one count per shape")
        save = (lambda r: pathlib.Path(args.json).write_text(json.dumps(r, indent=1))) if args.json else None
        result = run(args.shapes, layer_counts, args.ms, args.dispatch, args.verify, on_cell=save, sustained=args.sustained)
    print_report(result)
    if args.plot:
        plot(result, args.plot)
    return 1 if any(not v["ok"] for c in result["cells"] for name, v in c.get("verify", {}).items() if name == "ours") else 0


if __name__ == "__main__":
    sys.exit(main())
