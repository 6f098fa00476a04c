"""Tuner: build the tuned table for the GPU it runs on.

For each shape and M breakpoint it times candidate configs (fragment, tile and stream-K) with the
benchmark's timer (CUDA-graph replay over >= 512 MB of rotated weights, separator subtracted), checks
the winner against the FP32 reference, and writes one entry per run of breakpoints that share a
winner to ``tuned/<key>.json`` (key: compute capability and SM count). ``--update`` keeps the entries
of shapes not tuned in this run, so a long tuning can be done one shape per invocation.

    python maint/gemm/gemm_sm120/tune_sm120_nvfp4_w4a16_gemm.py --shapes 16384x5120 --update
"""

import argparse
import datetime
import json
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import benchmark_sm120_nvfp4_w4a16_gemm as bench  # noqa: E402
import sm120_nvfp4_w4a16_streamk as maint  # noqa: E402

nv = maint.example


def fits(config, n: int, k: int, arch: str) -> bool:
    try:
        if isinstance(config, maint.hopper.WgmmaConfig):
            if arch != "sm_90":
                return False
            maint.hopper.check_wgmma_config(config, n, k)
        elif isinstance(config, maint.StreamKConfig):
            maint.check_streamk_config(config, n, k, maint.smem_per_sm(arch))
        else:
            nv.check_config(config, n, k)
        return True
    except ValueError:
        return False


MAX_TUNED_STAGES = 8


def deepest(config, n: int, k: int, arch: str):
    """``config`` with the deepest cp.async pipeline (up to 8 stages) that still fits, or None.
    Deeper pipelines keep more weight bytes in flight, which is what small M is short of."""
    for stages in range(MAX_TUNED_STAGES, 1, -1):
        if fits(config._replace(stages=stages), n, k, arch):
            return config._replace(stages=stages)
    return None


def candidates(m: int, n: int, k: int, arch: str) -> list:
    """Configs worth timing at this M (about a dozen: compiling is the tuner's cost): the example's
    heuristic choice, its tile shape with deeper pipelines and other splits, and stream-K over it."""
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    heuristic = nv.get_config(m, n, k, sm_count=sm_count)
    s = heuristic.kernel_shape()
    out = [heuristic]
    if isinstance(heuristic, nv.FragConfig):
        for block_n, splits in [(128, (1, 2, 4, 8)), (256, (1, 2, 4))]:
            out += [deepest(nv.FragConfig(s.block_m, block_n, 128, split, 2), n, k, arch) for split in splits]
    else:
        out += [deepest(heuristic._replace(split_k=split), n, k, arch) for split in (1, 2)]
        out.append(nv.TileConfig(128, 128, 64, 2, 2, 1, 4))
    out += [deepest(maint.StreamKConfig(s.block_m, s.block_n, s.block_k, s.warps_m, s.warps_n, 2, c), n, k, arch) for c in (1, 2)]
    if arch == "sm_90":  # the Hopper wgmma kernel: x rows per CTA cover M up to 128
        out += [deepest(maint.hopper.WgmmaConfig(min(128, 16 * math.ceil(m / 16)), maint.hopper.SWIZZLE_K, 2), n, k, arch)]
    return [c for c in dict.fromkeys(out) if c is not None and fits(c, n, k, arch)]


def tune_shape(n: int, k: int, ms: list, arch: str, progress: bench.Progress) -> list:
    """``[(m, winner, us)]`` for each breakpoint, the winner verified against the FP32 reference."""
    copies = bench.copies_for(bench.weight_bytes(n, k))
    raw = [nv.random_nvfp4_weight(n, k, "cuda", torch.Generator().manual_seed(i)) for i in range(copies)]
    weights = [nv.prepare_nvfp4_weight(*r) for r in raw]
    separator_buffer = torch.zeros(1, device="cuda")
    winners = []
    for m in ms:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        timed = []
        for config in candidates(m, n, k, arch):
            calls = [lambda w=w, c=config: maint.nvfp4_w4a16_linear(x, w, c) for w in weights]
            timed.append((nv.GraphTimer(calls, lambda: separator_buffer.add_(1.0)).per_call_us(), config))
        timed.sort(key=lambda t: t[0])
        ref = nv.reference_nvfp4_linear(x, *raw[0])
        for us, config in timed:  # the fastest config that also passes the reference check
            if nv.compare_with_reference(maint.nvfp4_w4a16_linear(x, weights[0], config), ref)["ok"]:
                winners.append((m, config, us))
                break
        else:
            raise RuntimeError(f"no candidate passed the reference check at {n}x{k} M={m}")
        progress.step(f"{n}x{k} M={m}: {type(winners[-1][1]).__name__} {winners[-1][2]:.1f} us")
    return winners


def entries_from_winners(n: int, k: int, winners: list) -> list:
    """Merge consecutive breakpoints with the same winner; breakpoint m_i covers (m_{i-1}, m_i],
    and the last one reaches M = 1024."""
    entries, low = [], 1
    for i, (m, config, _) in enumerate(winners):
        high = nv.MAX_M_PER_LAUNCH if i == len(winners) - 1 else m
        if entries and maint.config_from_json(entries[-1]) == config:
            entries[-1]["m_max"] = high
        else:
            entries.append({"n": n, "k": k, "m_min": low, "m_max": high, **maint.config_to_json(config)})
        low = high + 1
    return entries


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=bench.parse_shapes, default=bench.DEFAULT_SHAPES)
    parser.add_argument("--ms", type=lambda t: [int(v) for v in t.split(",")], default=bench.DEFAULT_MS, help="M breakpoints")
    parser.add_argument("--out", help="table file (default: tuned/<this GPU's key>.json beside this script)")
    parser.add_argument("--update", action="store_true", help="keep the entries of shapes not tuned now")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: a table is measured on the GPU it is for")
    device = torch.device("cuda")
    key, arch = maint.gpu_key(device), nv.device_arch(device)
    path = pathlib.Path(args.out) if args.out else maint.table_path(key)
    ms = sorted(set(args.ms))
    nv.precompile({(n, k, c) for n, k in args.shapes for m in ms for c in candidates(m, n, k, arch)}, arch, maint.compile_any)
    progress = bench.Progress(len(args.shapes) * len(ms))
    entries = []
    for n, k in args.shapes:
        entries += entries_from_winners(n, k, tune_shape(n, k, ms, arch, progress))
    if args.update and path.exists():
        tuned = set(args.shapes)
        entries = [e for e in json.loads(path.read_text())["entries"] if (e["n"], e["k"]) not in tuned] + entries
    table = {"key": key, "gpu": torch.cuda.get_device_name(device), "date": datetime.date.today().isoformat(), "entries": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table, indent=1))
    print(f"wrote {len(entries)} entries for {key} to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
