"""Tests for maint/gemm/gemm_sm120/sm120_nvfp4_w4a16_streamk.py: the stream-K schedule, the
tuned-table dispatch, configs, compiling for sm_90 and sm_120, and (on a GPU) results against the
FP32 reference with the bounds of DESIGN.md section 8."""

import json
import pathlib
import re
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "maint" / "gemm" / "gemm_sm120"))

import sm120_nvfp4_w4a16_streamk as sk  # noqa: E402

nv = sk.example
HAS_GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (sm_90 or newer)")


# ---------------------------------------------------------------- CPU: the schedule


@pytest.mark.parametrize("tiles, k_tiles, ctas", [(1, 40, 132), (40, 48, 132), (128, 40, 132), (7, 3, 5), (300, 80, 264), (5, 2, 17)])
def test_streamk_schedule_covers_every_iteration_once(tiles, k_tiles, ctas):
    iterations = tiles * k_tiles
    grid = sk.streamk_grid(ctas, 1, iterations)
    owner = {}
    pieces = {}  # (cta, slot) -> tile
    for g in range(grid):
        begin, end = sk.streamk_range(g, iterations, grid)
        for i in range(begin, end):
            assert i not in owner
            owner[i] = g
        for tile in {i // k_tiles for i in range(begin, end)}:
            tile_begin = tile * k_tiles
            whole = begin <= tile_begin and end >= tile_begin + k_tiles
            if not whole:  # a piece goes to a partial slot, as the kernel does it
                slot = 0 if begin >= tile_begin else 1
                assert (g, slot) not in pieces, "two pieces in one slot"
                pieces[(g, slot)] = tile
    assert sorted(owner) == list(range(iterations))
    for i, g in owner.items():
        assert sk.streamk_cta_of(i, iterations, grid) == g
    for tile in range(tiles):
        first = sk.streamk_cta_of(tile * k_tiles, iterations, grid)
        last = sk.streamk_cta_of(tile * k_tiles + k_tiles - 1, iterations, grid)
        holders = sorted({owner[i] for i in range(tile * k_tiles, (tile + 1) * k_tiles)})
        assert holders == list(range(first, last + 1))
        if first != last:  # the reducer's slot formula finds every piece of the tile
            for c in holders:
                slot = 0 if sk.streamk_range(c, iterations, grid)[0] >= tile * k_tiles else 1
                assert pieces[(c, slot)] == tile


@pytest.mark.parametrize("waves", [1, 2, 3])
@pytest.mark.parametrize("tiles, k_tiles, grid", [(160, 96, 132), (272, 80, 132), (1088, 80, 132), (132, 16, 132), (512, 16, 132), (1024, 16, 264), (100, 8, 132), (7, 3, 5), (133, 1, 132), (300, 2, 132)])
def test_streamk_waves_schedule_covers_every_iteration_once(tiles, k_tiles, grid, waves):
    """``WgmmaStreamKConfig.streamk_waves``: the kernel's two phases of segments (``streamk_segments``,
    ``streamk_segment``, and ``cut``'s clipping, emulated) cover every (tile, k tile) once; only the
    first ``streamk_tiles`` tiles are cut, every CTA has stream-K work if any tile is shared, and the
    rest run whole, the same number of them on every CTA."""
    shared = sk.streamk_tiles(tiles, k_tiles, grid, waves)
    assert sk.streamk_tiles(tiles, k_tiles, grid, 0) == tiles
    if tiles < grid:
        assert shared == tiles
    else:
        assert (tiles - shared) % grid == 0 or shared == tiles
        assert shared in (tiles, tiles % grid + (waves - 1) * grid, tiles % grid + waves * grid)  # one wave more only where needed
    assert shared == 0 or shared * k_tiles >= grid  # every stream-K range is non-empty
    select = lambda c, a, b: a if c else b  # noqa: E731
    covered, whole_counts = [], []
    for g in range(grid):
        begin, end = sk.streamk_range(g, shared * k_tiles, grid) if shared else (0, 0)
        for phase in (0, 1):
            segments = range(*sk.streamk_segments(phase, g, begin, end, tiles, shared, grid, k_tiles, select))
            for s in segments:
                tile, lo, hi = sk.streamk_segment(phase, s, begin, end, g, shared, grid, k_tiles, select)
                lo, hi = max(lo, tile * k_tiles), min(hi, tile * k_tiles + k_tiles)  # as cut clips them
                assert (tile < shared) == (phase == 0) and (hi - lo == k_tiles or phase == 0)
                covered += [(tile, i - tile * k_tiles) for i in range(lo, hi)]
        whole_counts.append(len(segments))
    assert sorted(covered) == [(t, i) for t in range(tiles) for i in range(k_tiles)]
    assert len(set(whole_counts)) == 1


# ---------------------------------------------------------------- CPU: configs and tables

CONFIG_SHAPES = [
    (16384, 5120), (14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408),
    (4096, 4096), (640, 2304), (128, 256), (11008, 4096), (4096, 11008),
]  # fmt: skip


@pytest.mark.parametrize("n, k", CONFIG_SHAPES)
def test_every_streamk_heuristic_config_fits(n, k):
    for m in range(1, nv.MAX_M_PER_LAUNCH + 1, 7):
        config = sk.get_streamk_config(m, n, k, sm_count=132)
        if isinstance(config, sk.StreamKConfig):
            sk.check_streamk_config(config, n, k)
        else:
            nv.check_config(config, n, k)
        assert config.kernel_shape().shared_bytes() <= nv.SM120_SMEM_PER_CTA


def test_streamk_heuristic_only_where_it_measured_faster():
    assert isinstance(sk.get_streamk_config(64, 5120, 6144, sm_count=132), sk.StreamKConfig)
    assert sk.get_streamk_config(1, 16384, 5120, sm_count=132) == nv.get_config(1, 16384, 5120, sm_count=132)
    assert sk.get_streamk_config(1024, 5120, 6144, sm_count=132) == nv.get_config(1024, 5120, 6144, sm_count=132)
    assert isinstance(sk.get_streamk_config(64, 128, 256, sm_count=132), nv.FragConfig)  # ranges too short


TABLES = sorted(sk.TABLE_DIR.glob("*.json"))
TABLE_ENTRIES = [(path.stem, e) for path in TABLES for e in json.loads(path.read_text())["entries"]]


@pytest.mark.parametrize("key, entry", TABLE_ENTRIES, ids=[f"{k}-{e['n']}x{e['k']}-{e['m_min']}" for k, e in TABLE_ENTRIES])
def test_tuned_entries_fit_and_divide(key, entry):
    sk.check_any_config(sk.config_from_json(entry), entry["n"], entry["k"], key.split("-")[0])
    assert 1 <= entry["m_min"] <= entry["m_max"] <= nv.MAX_M_PER_LAUNCH


def test_table_applies_only_to_its_gpu_key(tmp_path, monkeypatch):
    monkeypatch.setattr(sk, "TABLE_DIR", tmp_path)
    sk.load_table.cache_clear()
    entry = {"n": 4096, "k": 4096, "m_min": 1, "m_max": 16, **sk.config_to_json(sk.StreamKConfig(ctas_per_sm=2))}
    (tmp_path / "sm_90-132sm.json").write_text(json.dumps({"key": "sm_90-132sm", "entries": [entry]}))
    (tmp_path / "sm_90-114sm.json").write_text(json.dumps({"key": "sm_90-132sm", "entries": [entry]}))
    try:
        assert sk.tuned_config(8, 4096, 4096, "sm_90-132sm") == sk.StreamKConfig(ctas_per_sm=2)
        assert sk.tuned_config(17, 4096, 4096, "sm_90-132sm") is None
        assert sk.tuned_config(8, 4096, 4096, "sm_120-188sm") is None  # no table for that GPU
        with pytest.raises(ValueError, match="not 'sm_90-114sm'"):
            sk.tuned_config(8, 4096, 4096, "sm_90-114sm")  # a file under the wrong key is refused
    finally:
        sk.load_table.cache_clear()


@pytest.mark.parametrize(
    "config, match",
    [
        (sk.StreamKConfig(ctas_per_sm=0), "ctas_per_sm"),
        (sk.StreamKConfig(ctas_per_sm=2, block_m=64, block_k=128, stages=3), "per SM"),
        (sk.StreamKConfig(ctas_per_sm=3, block_k=64, stages=5), "per SM"),  # 3 x 33280 bytes fit 100 KB only without each CTA's 1 KB driver reserve
        (sk.StreamKConfig(block_n=96), "block_n"),
    ],
)
def test_bad_streamk_configs(config, match):
    with pytest.raises(ValueError, match=match):
        sk.check_streamk_config(config, 4096, 4096)


def test_linear_rejects_a_foreign_config():
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(128, 256))
    with pytest.raises(TypeError, match="StreamKConfig"):
        sk.nvfp4_w4a16_linear(torch.zeros(2, 256, dtype=torch.bfloat16), w, config=(16, 128))


# ---------------------------------------------------------------- CPU: compiling


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("n, k, config", [(5120, 6144, sk.StreamKConfig()), (16384, 5120, sk.StreamKConfig(64, 256, 64, 1, 4, 4, 1))])
def test_streamk_compiles(arch, n, k, config):
    source = sk.compile_streamk(n, k, config, arch).get_kernel_source()
    assert "mul.rn.bf16x2" in source and "cp_async" in source and "AtomicAddRet" in source
    assert source.count("__syncthreads()") == 4  # one per k tile; after the arrival, and after the wait or the write


def test_streamk_fixup_orders_pieces_by_release_and_acquire():
    """No fence in the fix-up: a writer's WRITTEN add is a release after the barrier (TileLang passes
    the order as an int, cuda::std::memory_order_release = 3) and the reducer polls with an acquire
    (2); release is cumulative over the CTA's piece, which the barrier orders before it."""
    source = sk.compile_streamk(5120, 6144, sk.StreamKConfig(), "sm_90").get_kernel_source()
    assert "__threadfence" not in source
    assert re.findall(r"AtomicAdd\(\(&\(tickets\[[^]]*\]\)\), 65536, (\d)\)", source) == ["3"]
    assert re.findall(r"AtomicLoad\(\(&\(tickets\[[^]]*\]\)\), (\d)\)", source) == ["2"]


def test_assume_positive_grid_removes_sign_fixups():
    with_assume = sk.compile_streamk(4096, 4096, sk.StreamKConfig(), "sm_90", True).get_kernel_source()
    without = sk.compile_streamk(4096, 4096, sk.StreamKConfig(), "sm_90", False).get_kernel_source()
    assert without.count("% grid") > 0 and with_assume.count("% grid") == 0


# ---------------------------------------------------------------- GPU


def assert_ok(result):
    assert result["ok"], result


STREAMK_CASES = [
        (1, 4096, 4096, sk.StreamKConfig()),
        (16, 5120, 6144, sk.StreamKConfig(ctas_per_sm=2)),
        (33, 640, 2304, sk.StreamKConfig(block_m=48, stages=3)),
        (64, 4096, 4096, sk.StreamKConfig(block_m=64, block_k=128, stages=3)),
        (200, 5120, 6144, sk.StreamKConfig(64, 256, 64, 1, 4, 4, 1)),
        (1024, 4096, 4096, sk.StreamKConfig(64, 256, 64, 1, 4, 4, 1)),
        (300, 128, 256, sk.StreamKConfig(64, 128, 64, 1, 2, 2, 3)),  # more CTAs than iterations
        (1100, 4096, 4096, sk.StreamKConfig(128, 128, 64, 2, 2, 4, 1)),
]
GRAPH_CONFIGS = {
    1: sk.StreamKConfig(16, 128, 128, 1, 4, 4, 1),
    64: sk.StreamKConfig(64, 128, 128, 1, 4, 3, 1),
    300: sk.StreamKConfig(64, 256, 64, 1, 4, 4, 1),
}
# From (40, 4096, 4096): the sm_90 heuristic's split-wave rule (hopper.split_wave_config)
# at splits 4, 2 and 1, on one weight tile with as few k tiles as stages, on 86 tiles, at 72 rows
# split 4, at 96 rows as stream-K (96 CTAs leave over a sixth of the SMs idle), and past 128 rows:
# 144 split 4 (86 k tiles: an uneven split), 136 as stream-K and 168 split 6 (four stages); from 177
# rows two x blocks: 201 split 2 (a ragged second block), 200 as stream-K; and whole blocks in 8-row
# steps, 720 rows as four of 184 (four stages); the narrow split wave (hopper.narrow_split_wave_config)
# at 20 rows of 640x2304 (split 4), over three 64-row blocks split 5 (32 k tiles: uneven) and over
# seven split 16 on one weight tile; stream-K over two 136-row x blocks 128 deep (sk.TWO_BLOCK_STREAMK_MIN_M);
# the two-block split wave (hopper.two_block_split_wave_config): two 72-row blocks split 2, two 64-row
# and two 32-row blocks unsplit; past 256 rows, two warpgroups' stream-K where one warpgroup's 128-row
# blocks would run past one wave (833 rows of 6144x4096) and past two (832 of 10240x4096)
# (hopper.ONE_WARPGROUP_MAX_WAVES), and the wide one wave, five 192-row blocks 64 deep
# (hopper.WIDE_ONE_WAVE_MIN_FILL).
DISPATCH_CASES = [
    (1, 16384, 5120), (64, 5120, 6144), (700, 5120, 17408),
    (40, 4096, 4096), (20, 640, 2304), (17, 128, 512), (33, 11008, 4096), (72, 4096, 11008), (96, 6144, 4096),
    (144, 4096, 11008), (136, 6144, 4096), (168, 2560, 8192), (201, 4096, 11008), (200, 3072, 4096), (720, 4096, 4096),
    (192, 1024, 4096), (400, 128, 8192), (272, 11008, 4096), (144, 3072, 4096), (128, 4608, 2048), (64, 6144, 2048),
    (833, 6144, 4096), (929, 3072, 4096), (832, 10240, 4096),
]  # fmt: skip


@pytest.fixture(scope="session", autouse=True)
def precompiled_streamk_kernels(precompiles):
    """Compile the GPU tests' kernels in parallel processes first (TileLang's disk cache turns each
    in-test compile into a load). Correctness does not depend on it."""
    if not HAS_GPU or not precompiles:
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    major, minor = torch.cuda.get_device_capability()
    cases = {(n, k, c) for _, n, k, c in STREAMK_CASES} | {(5120, 6144, c) for c in GRAPH_CONFIGS.values()}
    key, arch = sk.gpu_key(torch.device("cuda")), f"sm_{major}{minor}"
    dispatched = [sk.tuned_config(m, n, k, key) or sk.heuristic_config(m, n, k, arch=arch, sm_count=sms) for m, n, k in DISPATCH_CASES]
    cases |= {(n, k, c) for (_, n, k), c in zip(DISPATCH_CASES, dispatched)}
    nv.precompile(cases, arch, sk.compile_any)


@needs_gpu
@pytest.mark.parametrize("m, n, k, config", STREAMK_CASES)
def test_streamk_matches_reference(m, n, k, config):
    assert_ok(nv.verify(m, n, k, config=config, seed=m, linear=sk.nvfp4_w4a16_linear))


@needs_gpu
@pytest.mark.parametrize("m", [1, 64, 300])
def test_streamk_graph_replays_match_eager(m):
    n, k = 5120, 6144
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(n, k, "cuda"))
    config = GRAPH_CONFIGS[m]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert nv.graph_replays_match_eager(lambda x: sk.nvfp4_w4a16_linear(x, w, config), x)


@needs_gpu
def test_default_dispatch_matches_reference():
    for m, n, k in DISPATCH_CASES:
        packed, scales, alpha = nv.random_nvfp4_weight(n, k, "cuda", torch.Generator().manual_seed(m))
        w = nv.prepare_nvfp4_weight(packed, scales, alpha)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        assert_ok(nv.compare_with_reference(sk.nvfp4_w4a16_linear(x, w), nv.reference_nvfp4_linear(x, packed, scales, alpha)))


@needs_gpu
@pytest.mark.slow
@pytest.mark.parametrize("key, entry", TABLE_ENTRIES, ids=[f"{k}-{e['n']}x{e['k']}-{e['m_min']}" for k, e in TABLE_ENTRIES])
def test_tuned_entry_at_range_start_middle_end(key, entry):
    if key != sk.gpu_key(torch.device("cuda")):
        pytest.skip(f"table for {key}, this GPU is {sk.gpu_key(torch.device('cuda'))}")
    config = sk.config_from_json(entry)
    n, k = entry["n"], entry["k"]
    for m in sorted({entry["m_min"], (entry["m_min"] + entry["m_max"]) // 2, entry["m_max"]}):
        assert_ok(nv.verify(m, n, k, config=config, seed=m, linear=sk.nvfp4_w4a16_linear))
