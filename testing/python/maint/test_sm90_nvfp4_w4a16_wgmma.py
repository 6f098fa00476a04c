"""Tests for maint/gemm/gemm_sm90/sm90_nvfp4_w4a16_wgmma.py, the sm_90a wgmma kernel with the
dequantized weights as the register operand: compiling for sm_90a, never being chosen or launched on
another arch, and (on an sm_90 GPU) results against the FP32 reference (DESIGN.md section 8)."""

import collections
import contextlib
import pathlib
import re
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
RESULTS = ROOT / "maint" / "gemm" / "gemm_sm120" / "results"  # committed H200 runs, races and timings
sys.path.insert(0, str(ROOT / "maint" / "gemm" / "gemm_sm120"))

import sm120_nvfp4_w4a16_streamk as sk  # noqa: E402
from ptxas import ptxas_report  # noqa: E402

wg = sk.hopper
nv = sk.example
ON_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_sm90 = pytest.mark.skipif(not ON_SM90, reason="needs an sm_90 GPU (H100/H200)")


@contextlib.contextmanager
def patched_dispatch(owner, **values):
    """The dispatch with ``owner``'s attributes set to ``values`` (its cache cleared on the way in
    and out)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in values.items():
            patch.setattr(owner, name, value)
        sk.heuristic_config.cache_clear()
        try:
            yield
        finally:
            sk.heuristic_config.cache_clear()


def h200_dispatch(m: int, n: int, k: int):
    """The stream-K module's heuristic dispatch on the H200 (sm_90, 132 SMs), where the tests' timings
    come from."""
    return sk.heuristic_config(m, n, k, arch="sm_90", sm_count=132)


def dispatch_without(owner, rule: str):
    """The dispatch with ``owner.rule`` giving no config, so that the rules under it decide."""
    return patched_dispatch(owner, **{rule: lambda *args, **kwargs: None})


@pytest.fixture
def without_one_wave():
    """The dispatch without the one-wave rule (``wg.one_wave_config``), which comes first and was
    added after the rules that the tests using this check against their own committed timings."""
    with dispatch_without(wg, "one_wave_config"):
        yield


@pytest.fixture
def without_split_wave():
    """The heuristic without the split-wave rule (``wg.split_wave_config``), which comes
    before the x-block, stage and loader rules that the tests using this check, and was added after
    the committed runs some of them read."""
    with dispatch_without(wg, "split_wave_config"):
        yield


@pytest.fixture
def whole_waves_in_16_row_steps():
    """The whole-wave rules with their x blocks in 16-row steps, as they were when the committed
    timings that the tests using this read were taken (``wg.WHOLE_WAVES_ROW_STEP``; their minimum
    blocks, multiples of 8, pick the same cells either way), and the split-wave rule to 176 rows."""
    with patched_dispatch(wg, WHOLE_WAVES_ROW_STEP=16, SPLIT_WAVE_MAX_M=176):
        yield


@pytest.fixture
def without_narrow_split_wave():
    """The dispatch without the narrow split wave (``wg.FEW_CTAS_MAX_FILL`` 0: no config fills so few
    SMs), which takes over the few-CTA cells of the rules that the tests using this check against
    timings committed before it."""
    with patched_dispatch(wg, FEW_CTAS_MAX_FILL=0):
        yield


@pytest.fixture
def without_two_block_streamk():
    """The dispatch without stream-K over two x blocks at M = 257-352 (``sk.TWO_BLOCK_STREAMK_MIN_M``
    past every M), which takes over cells of the rules that the tests using this check against
    timings committed before it."""
    with patched_dispatch(sk, TWO_BLOCK_STREAMK_MIN_M=nv.MAX_M_PER_LAUNCH + 1):
        yield


@pytest.fixture
def without_two_cta_split_wave():
    """The dispatch without the two-CTA split wave at M = 17-32 (``wg.two_cta_split_wave_config``),
    which comes first and takes over cells that the tests using this check against timings committed
    before it."""
    with dispatch_without(wg, "two_cta_split_wave_config"):
        yield


@pytest.fixture
def without_two_block_split_wave():
    """The dispatch without the two-block split wave under 177 rows (``wg.two_block_split_wave_config``),
    which takes over cells of the split wave that the tests using this check against timings
    committed before it."""
    with dispatch_without(wg, "two_block_split_wave_config"):
        yield


@pytest.fixture
def before_the_large_m_rules():
    """The dispatch without the wide one wave (``wg.WIDE_ONE_WAVE_MIN_FILL`` past any fill) and without
    two warpgroups past one wave of 128-row blocks (``wg.ONE_WARPGROUP_MAX_WAVES`` past any number of
    waves), which take over cells of the rules that the tests using this check against timings committed
    before them."""
    with patched_dispatch(wg, WIDE_ONE_WAVE_MIN_FILL=float("inf"), ONE_WARPGROUP_MAX_WAVES=float("inf")):
        yield


@pytest.fixture
def without_skinny():
    """The dispatch without the skinny kernel's rule for M <= 8 (``skinny.heuristic_config``), which
    comes first and was added after the wgmma rules that the tests using this check against their
    own committed timings; where it gives no config the dispatch runs those rules as before."""
    with dispatch_without(sk.skinny, "heuristic_config"):
        yield


@pytest.mark.parametrize(
    "config",
    [
        wg.WgmmaConfig(16, 64, 4),
        wg.WgmmaConfig(128, 64, 3),
        wg.WgmmaConfig(16, 64, 4, tma_loads=True),
        wg.WgmmaConfig(256, 64, 4, tma_loads=True, warpgroups=2),
        wg.WgmmaConfig(32, 64, 8, split_k=4, warpgroups=2),
        wg.WgmmaConfig(320, 64, 5, tma_loads=True, warpgroups=2),
        wg.WgmmaConfig(272, 64, 5, warpgroups=2),
        wg.WgmmaConfig(32, 128, 5, split_k=2),
        wg.WgmmaConfig(96, 128, 4, tma_loads=True),
        wg.WgmmaConfig(256, 128, 3, tma_loads=True, warpgroups=2),
    ],
)
def test_compiles_for_sm90a(config):
    source = wg.compile_wgmma(5120, 6144, config).get_kernel_source()
    dequant = "nvfp4_dequant_block(" if config.warpgroups == 1 else "nvfp4_dequant_half_block("
    assert "wgmma_rs<" in source and dequant in source and "mul.rn.bf16x2" in source
    assert f"__launch_bounds__({config.warpgroups * wg.WARPGROUP_THREADS}" in source
    # Above wgmma's largest N, two wgmmas per k16 step (x rows 0-255 and the rest) from the same A.
    chunks = -(-config.block_x // wg.WGMMA_MAX_N)
    assert len(set(re.findall(r"wgmma_rs<[^>]*>", source))) == chunks
    if config.tma_loads:
        # Every load is TMA (async proxy, like the wgmma's reads): no proxy fence anywhere. The x
        # tile takes one box per 256 rows (a TMA box's limit); the boxes of a 128-deep k tile's two
        # x panels come from one unrolled loop.
        loads = 2 + chunks  # codes, scales and the x boxes
        assert source.count("tl::tma_load(") == 2 * loads and "fence_proxy_async" not in source  # in the prologue and in the loop
        assert "cp_async" not in source
    else:
        # cp.async writes are generic-proxy: a fence after each stage's wait, before the wgmma reads.
        assert "tma_load" not in source and "cp_async_gs" in source and "fence_proxy_async" in source
    # The descriptor's 128-byte swizzle is applied to address bits: the x stages (each a multiple of
    # 1024 bytes) must start on a 1024-byte boundary of the 1024-aligned dynamic shared memory.
    offset = re.search(r"x_tiles = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\)", source)
    assert "__align__(1024)" in source and offset and int(offset.group(1)) % 1024 == 0


@pytest.mark.parametrize(
    "n, k, config",
    [
        (5120, 6144, wg.WgmmaConfig(128, 64, 4)),
        (640, 2304, wg.WgmmaConfig(80, 64, 4, split_k=4)),  # 96 and 9 k tiles
        (34816, 5120, wg.WgmmaConfig(8, 64, 8, split_k=2)),  # the smallest x block
        (5120, 6144, wg.WgmmaConfig(128, 64, 4, tma_loads=True)),
        (640, 2304, wg.WgmmaConfig(80, 64, 4, split_k=4, tma_loads=True)),
        (5120, 6144, wg.WgmmaConfig(256, 64, 4, tma_loads=True, warpgroups=2)),
        (640, 2304, wg.WgmmaConfig(144, 64, 4, split_k=4, warpgroups=2)),
        (16384, 5120, wg.WgmmaConfig(32, 64, 8, split_k=2, warpgroups=2)),
        (16384, 5120, wg.WgmmaConfig(320, 64, 5, tma_loads=True, warpgroups=2)),
        (16384, 5120, wg.WgmmaConfig(32, 128, 5, split_k=2)),
        (16384, 5120, wg.WgmmaConfig(96, 128, 3)),  # MAX_WGMMA_OPERAND_REGISTERS exactly
        (16384, 5120, wg.WgmmaConfig(256, 128, 3, tma_loads=True, warpgroups=2)),
        (34816, 5120, sk.WgmmaStreamKConfig(24, 128, 7, 2, True)),  # the tuner's narrow twins (NARROW_TWINS_MAX_M)
        (34816, 5120, sk.WgmmaStreamKConfig(40, 128, 5, 2, True)),
        (16384, 5120, wg.WgmmaConfig(24, 128, 13, 1, True, 2, True)),  # two warpgroups on an 8-row step
        (5120, 17408, sk.WgmmaStreamKConfig(40, 128, 8, 1, True, 2, True)),
        (34816, 5120, sk.WgmmaStreamKConfig(32, 128, 6, 2, True, 1, False, 0, 2)),  # a_batches
        (34816, 5120, sk.WgmmaStreamKConfig(64, 128, 4, 2, True, 1, False, 0, 4)),
        (5120, 6144, wg.WgmmaConfig(96, 128, 3, split_k=2, a_batches=2)),
        (34816, 5120, sk.WgmmaStreamKConfig(32, 128, 5, 2, True, 1, True, 0, 2, True)),  # scale pairs
    ],
)
def test_wgmma_stays_in_flight_across_the_next_dequant(n, k, config):
    """The kernel's overlap holds only if ptxas keeps the wgmmas asynchronous: when it cannot prove
    that no other instruction writes their A registers in flight (an odd tile peeled after the loop
    did that), it serializes every wgmma and says so (C7513)."""
    report = ptxas_report(sk.compile_any(n, k, config, "sm_90").get_kernel_source())
    assert "Used" in report and "registers" in report  # ptxas -v reported on the kernel
    assert "C7513" not in report and "serialized" not in report, report


def registers(report: str) -> int:
    (used,) = re.findall(r"Used (\d+) registers", report)
    return int(used)


@pytest.mark.parametrize(
    "n, k, config",
    [
        (5120, 6144, wg.WgmmaConfig(256, 64, 4, 1, True, 2, True)),  # two passes of 64 weight rows
        (5120, 6144, wg.WgmmaConfig(128, 128, 5, 3, True, 2, True)),  # split-K: one pass of 128
        (640, 2304, wg.WgmmaConfig(8, 64, 8, 4)),
        (5120, 6144, sk.WgmmaStreamKConfig(256, 64, 4, 1, True, 2, True)),  # whole tiles and the fix-up's sums
    ],
)
def test_output_tile_leaves_as_16_byte_stores(n, k, config):
    """The output tile goes out through a shared stage as 16-byte stores of whole x rows: stored
    straight from the accumulators it took 1024 scattered 2-byte stores per CTA, 5 us per tile (H200,
    results/h200_timings_2026-11-30p_epilogue_probe.json)."""
    source = sk.compile_any(n, k, config, "sm_90").get_kernel_source()
    assert "*(uint4*)(y + " in source
    assert not re.findall(r"\by\[", source), "a scattered element store of y is left"
    if config.producer and isinstance(config, sk.WgmmaStreamKConfig):
        # the producer refills the stage the store went through: its TMA writes follow generic ones
        assert "fence_proxy_async" in source


def test_split_k_exchange_adds_no_registers():
    """The split-K reduction reads the partials one split at a time: with every split's loads in
    flight (nvcc unrolled the split loop) the 16-row fragment tile at split 8 took 160 registers
    against 96, fewer CTAs per SM at M = 1 (H200, 2026-11-30l: 37.7 us against 35.1)."""
    tile = nv.FragConfig(16, 128, 128, split_k=1, stages=3)
    unsplit, split = (registers(ptxas_report(nv.compile_kernel(34816, 5120, tile._replace(split_k=s), "sm_90").get_kernel_source())) for s in (1, 8))
    assert split <= unsplit + wg.REGISTER_STEP, (split, unsplit)


def test_split_k_exchange_keeps_two_warpgroups_in_registers():
    """Two consumer warpgroups of 128 accumulators each, split 3: with one 64-bit address per
    accumulator (row-major partials) ptxas spilled 400 bytes, and the exchange took 40 us of 72
    (5120x6144, M = 256; H200, 2026-11-30m); the fragment-order slots need none."""
    config = wg.WgmmaConfig(256, 64, 6, split_k=3, tma_loads=True, warpgroups=2, producer=True)
    report = ptxas_report(wg.compile_wgmma(5120, 6144, config).get_kernel_source())
    assert re.findall(r"(\d+) bytes spill stores", report) == ["0"], report


def test_heuristic_picks_it_on_sm90_only():
    for n, k in [(16384, 5120), (5120, 6144), (640, 2304), (128, 256), (384, 768)]:  # down to the smallest weight
        for m in range(1, nv.MAX_M_PER_LAUNCH + 1, 5):
            assert not isinstance(sk.heuristic_config(m, n, k, arch="sm_120", sm_count=188), sk.HOPPER_CONFIGS)
            on_hopper = h200_dispatch(m, n, k)
            few_rows = sk.skinny.heuristic_config(m, n, k, sm_count=132)
            if few_rows is not None:
                assert on_hopper == few_rows, (m, n, k)
            else:
                assert isinstance(on_hopper, sk.HOPPER_CONFIGS) == (m >= wg.heuristic_min_m(n, 132)), (m, n, k)
            sk.check_any_config(on_hopper, n, k, "sm_90")


def test_tuner_offers_it_only_on_sm90():
    import tune_sm120_nvfp4_w4a16_gemm as tune

    for m in (1, 8, 17, 48, 64, 1024):
        assert any(isinstance(c, wg.WgmmaConfig) for c in tune.candidates(m, 5120, 6144, "sm_90"))
        assert not any(isinstance(c, wg.WgmmaConfig) for c in tune.candidates(m, 5120, 6144, "sm_120"))


def test_tuner_pads_decode_m_to_8_rows():
    """At M <= 8 the tuner offers 8-row x blocks (wgmma's smallest N) beside 16, over stages and splits."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    for m in (1, 8):
        blocks = {c.block_x for c in tune.candidates(m, 34816, 5120, "sm_90") if isinstance(c, wg.WgmmaConfig)}
        assert blocks == {8, 16}
    offered = set(tune.candidates(1, 34816, 5120, "sm_90"))
    assert wg.WgmmaConfig(8, 64, 8, 2) in offered and wg.WgmmaConfig(8, 64, 4, 1) in offered
    assert {c.block_x for c in tune.candidates(32, 34816, 5120, "sm_90") if isinstance(c, wg.WgmmaConfig)} == {32}


def test_tuner_offers_two_warpgroups_at_both_k_depths_above_16_rows():
    """Above 16 rows: the deepest pipeline and stream-K per cover, 64 deep always and 128 deep
    where four stages fit (up to 176 rows; with three they lost 1.4-3.3x, and 1.04x with a
    producer); 304 rows: 64 deep only. Each with and without the producer warpgroup. Up to 128 rows
    the one cover is the tight x block."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    two = {c for c in tune.candidates(144, 16384, 5120, "sm_90") if getattr(c, "warpgroups", 1) == 2}
    assert wg.WgmmaConfig(144, 64, wg.deepest_stages(144, ctas_per_sm=1), 1, True, 2, True) in two
    assert wg.WgmmaConfig(144, 128, 5, 1, True, 2, True) in two and sk.WgmmaStreamKConfig(144, 128, 4, 1, True, 2, True) in two
    two = {c for c in tune.candidates(256, 16384, 5120, "sm_90") if getattr(c, "warpgroups", 1) == 2 and c.block_x == 256}
    assert wg.WgmmaConfig(256, 64, wg.deepest_stages(256, ctas_per_sm=1), 1, True, 2, True) in two
    assert all(c.block_k == 64 and c._replace(producer=not c.producer) in two for c in two)
    wide = {c for c in tune.candidates(304, 16384, 5120, "sm_90") if getattr(c, "block_x", 0) == 304}
    assert wide and all(c.block_k == 64 for c in wide)
    two = {c for c in tune.candidates(96, 16384, 5120, "sm_90") if getattr(c, "warpgroups", 1) == 2}
    assert {c.block_x for c in two} == {96}
    assert wg.WgmmaConfig(96, 64, wg.deepest_stages(96, ctas_per_sm=1), 1, True, 2, True) in two
    assert sk.WgmmaStreamKConfig(96, 64, 4, 1, True, 2, True) in two
    # stream-K also with the deepest pipeline one CTA holds (2026-11-30k)
    assert sk.WgmmaStreamKConfig(96, 128, wg.deepest_stages(96, ctas_per_sm=1, block_k=128), 1, True, 2, True) in two
    # and, 128 deep, with TWO_WARPGROUP_STREAMK_STAGES between 4 and the deepest (13 at 32 rows; 2026-12-01w)
    streamk = {c.stages for c in tune.candidates(32, 5120, 17408, "sm_90") if isinstance(c, sk.WgmmaStreamKConfig) and c.warpgroups == 2 and c.block_k == 128}
    assert streamk == {4, tune.TWO_WARPGROUP_STREAMK_STAGES, wg.deepest_stages(32, ctas_per_sm=1, block_k=128)} and len(streamk) == 3
    assert {c.block_x for c in tune.candidates(32, 16384, 5120, "sm_90") if getattr(c, "warpgroups", 1) == 2} == {32}
    # Above 128 rows also two warpgroups' 128-deep stream-K over one warpgroup's tight block (2026-11-30s)
    for m, block_x in ((144, 80), (256, 128), (1024, 128)):
        assert sk.WgmmaStreamKConfig(block_x, 128, 4, 1, True, 2, True) in tune.candidates(m, 5120, 6144, "sm_90")
    # At 16 rows and fewer, only split-K with a producer (below).
    assert all(c.producer and c.split_k > 1 for c in tune.candidates(16, 16384, 5120, "sm_90") if getattr(c, "warpgroups", 1) == 2)


@pytest.mark.parametrize("m, narrow, tight", [(17, 24, 32), (24, 24, 32), (40, 40, 48), (56, 56, 64)])
def test_tuner_offers_x_blocks_in_eight_row_steps(m, narrow, tight):
    """Between the tight x block's 16-row steps (``wg.TIGHT_ROW_STEP``) every candidate on it, of
    one or two warpgroups, comes also on the block in 8-row steps; where the tight block is already
    the narrowest (M = 32) nothing is added. (The scale-pair twins take each block's own depths:
    ``test_tuner_offers_scale_pair_twins``.)"""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    def wgmma(m):
        return {c for c in tune.candidates(m, 34816, 5120, "sm_90") if isinstance(c, (wg.WgmmaConfig, sk.WgmmaStreamKConfig))}

    assert wg.tight_wgmma_config(m, 34816, 5120).block_x == tight
    assert wg.tight_wgmma_config(m, 34816, 5120, row_step=wg.X_BLOCK_STEP).block_x == narrow
    on_tight = {c for c in wgmma(m) if c.block_x == tight} - set(tune.scale_pair_twins(wgmma(m)))
    assert {c.warpgroups for c in on_tight} == {1, 2} and {c._replace(block_x=narrow) for c in on_tight} <= wgmma(m)
    assert sk.WgmmaStreamKConfig(narrow, 128, wg.deepest_stages(tight, 2, 128), 2, True) in wgmma(m)  # the table's kind, tight's stages
    assert not any(c.block_x == 24 for c in wgmma(32))


def test_tuner_offers_narrow_one_warpgroup_streamk_with_both_loaders():
    """One-warpgroup 128-deep stream-K is offered with TMA loads beside cp.async up to
    TMA_STREAMK_MAX_BLOCK_X rows (it won 34816x5120 M = 17-32 with TMA, 2026-12-01x, and M = 33-64,
    2026-12-02), and by TMA also with a producer and two A batches (2026-12-03i, M = 24-64); wider
    blocks are not offered 128 deep."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    def one_warpgroup_deep(m):
        return {c for c in tune.candidates(m, 34816, 5120, "sm_90") if isinstance(c, sk.WgmmaStreamKConfig) and c.warpgroups == 1 and c.block_k == 128}

    # the H200 table's winners before the producer twins, at M = 17-32, 33-48 and 49-64, each beside
    # its cp.async twin and its producer twin
    for m, winner in ((32, sk.WgmmaStreamKConfig(32, 128, 6, 2, True, 1, False)), (48, sk.WgmmaStreamKConfig(48, 128, 5, 2, True, 1, False)),
                      (64, sk.WgmmaStreamKConfig(64, 128, 4, 2, True, 1, False))):
        offered = one_warpgroup_deep(m)
        both = {c for c in offered if not c.producer}
        assert winner in both and {c._replace(tma_loads=not c.tma_loads) for c in both} == both
        by_tma = {c for c in both if c.tma_loads}
        producers = {c._replace(producer=True, a_batches=tune.ONE_WARPGROUP_PRODUCER_A_BATCHES) for c in by_tma}
        assert producers <= offered - both and offered - both - producers <= set(tune.scale_pair_twins(producers))
    # wider one-warpgroup blocks hold fewer than WGMMA_DEEP_K_MIN_STAGES 128-deep stages: none offered
    assert all(c.block_x <= tune.TMA_STREAMK_MAX_BLOCK_X for m in (96, 256, 1024) for c in one_warpgroup_deep(m))


@pytest.mark.parametrize("m, block_x", [(232, 80), (384, 128), (512, 176), (608, 208), (768, 256)])
def test_tuner_offers_one_wave_of_whole_tiles_on_few_weight_tiles(m, block_x):
    """N = 5120 has 40 weight tiles: three x blocks fill one wave of 132 SMs with 120 whole tiles.
    The tuner offers that block unsplit (two consumer warpgroups, a producer, the deepest pipeline),
    64 deep and 128 deep where four stages fit; nothing on N >= 16384 (128 or more weight tiles)."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    assert wg.whole_waves_block_x(m, 5120, 132) == block_x
    assert -(-m // block_x) * 40 <= 132 < (-(-m // block_x) + 1) * 40
    offered = set(tune.candidates(m, 5120, 6144, "sm_90"))
    assert wg.WgmmaConfig(block_x, 64, wg.deepest_stages(block_x, ctas_per_sm=1), 1, True, 2, True) in offered
    deep = wg.WgmmaConfig(block_x, 128, wg.deepest_stages(block_x, ctas_per_sm=1, block_k=128), 1, True, 2, True)
    assert (deep in offered) == (deep.stages >= tune.WGMMA_DEEP_K_MIN_STAGES)
    assert wg.whole_waves_block_x(m, 16384, 132) is None and wg.whole_waves_block_x(m, 34816, 132) is None
    assert wg.whole_waves_block_x(1024, 5120, 132) == 344  # three blocks, in 8-row steps
    assert wg.WgmmaConfig(344, 64, 4, 1, True, 2, True) in set(tune.candidates(1024, 5120, 6144, "sm_90"))
    assert wg.whole_waves_block_x(1024, 5120, 100) is None  # two blocks would be 512 rows wide
    # Two waves from 64-row blocks: six of 176 rows at M = 1024 (240 tiles), none of 16 at M = 32
    assert wg.WgmmaConfig(176, 128, 4, 1, True, 2, True) in set(tune.candidates(1024, 5120, 6144, "sm_90"))
    assert wg.whole_waves_block_x(32, 16384, 132, waves=2) == 16
    assert all(c.block_x != 16 for c in tune.candidates(32, 16384, 5120, "sm_90") if getattr(c, "warpgroups", 1) == 2)


def test_tuner_whole_wave_candidates_take_short_k():
    """Where the deepest pipeline holds more stages than K has k tiles, the whole-wave candidates
    take K's k tiles instead of dropping out (``wg.whole_tiles_config``, shared with the heuristic):
    4224x1024 has 33 weight tiles, so M = 32 runs as two 16-row x blocks, with 16 stages 64 deep or
    8 stages 128 deep."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    assert wg.whole_waves_block_x(32, 4224, 132) == 16
    offered = set(tune.candidates(32, 4224, 1024, "sm_90"))
    for block_k, stages in ((64, 16), (128, 8)):
        assert wg.deepest_stages(16, ctas_per_sm=1, block_k=block_k) > stages
        assert wg.WgmmaConfig(16, block_k, stages, 1, True, 2, True) in offered


def test_heuristic_one_wave_of_whole_tiles_and_its_limits():
    """Where the weight tiles are few the dispatch cuts M into as many x blocks as one wave holds:
    unsplit, two consumer warpgroups and a producer, 128 deep, the deepest pipeline
    (``wg.ONE_WAVE_MIN_STAGES``); not under 64-row blocks, not under 128 rows past K = 6144, not
    with fewer than four stages, never where one x block already fills the SMs."""
    assert h200_dispatch(256, 4096, 4096) == wg.WgmmaConfig(64, 128, 9, 1, True, 2, True)  # 4 blocks x 32 tiles
    assert h200_dispatch(512, 5120, 6144) == wg.WgmmaConfig(176, 128, 4, 1, True, 2, True)  # 3 blocks x 40 tiles
    assert h200_dispatch(512, 4096, 14336) == wg.WgmmaConfig(128, 128, 5, 1, True, 2, True)  # long K, 128 rows
    assert wg.one_wave_config(96, 6144, 6144) is None  # 48-row blocks
    assert wg.one_wave_config(256, 4096, 11008) is None  # 64 rows past K = 6144
    assert wg.one_wave_config(384, 6144, 4096) is None  # 192 rows: three stages
    assert wg.one_wave_config(4096 // 16, 4096, 4096, sm_count=16) is None  # one block of tiles fills 16 SMs
    for m in range(1, nv.MAX_M_PER_LAUNCH + 1, 3):
        for n, k in ((16384, 5120), (34816, 5120), (11008, 4096), (4096, 4096 + 64)):
            assert wg.one_wave_config(m, n, k) is None, (m, n, k)  # >= 66 tiles, or K not 128-deep
        c = wg.one_wave_config(m, 3072, 4096)
        if c is not None:
            x_blocks = -(-m // c.block_x)
            assert x_blocks * 24 <= 132 and c.stages >= wg.ONE_WAVE_MIN_STAGES and c.block_x >= wg.ONE_WAVE_MIN_BLOCK_X
            wg.check_wgmma_config(c, 3072, 4096)


def test_one_wave_rule_against_the_committed_h200_timings(whole_waves_in_16_row_steps, before_the_large_m_rules):
    """The one-wave rule was read off the H200 probes committed under results/ (each config raced
    and verified beside the dispatch's without the rule): every cell it takes there ran faster with
    it, and in the untuned benchmark runs before and after it every cell it takes got faster."""
    taken = 0
    for name in ("h200_timings_2026-11-30w_one_wave_probe.json", "h200_timings_2026-11-30w_one_wave_rule_probe.json"):
        for (n, k, m), times in committed_timings(name).items():
            rule = wg.one_wave_config(m, n, k)
            if rule is not None:
                assert min(times, key=times.get) == rule, (n, k, m)
                taken += 1
    assert taken == 21

    before, after = untuned_run("h200_untuned_2026-11-30v.json"), untuned_run("h200_untuned_2026-11-30w.json")
    ratios = [after[key] / before[key] for key in after if wg.one_wave_config(key[2], *key[:2]) is not None]
    assert len(ratios) == 22 and max(ratios) < 0.99


def test_heuristic_two_whole_waves_over_stream_k_or_one_warpgroup(whole_waves_in_16_row_steps, before_the_large_m_rules):
    """Where the dispatch would run stream-K or one warpgroup, M cut into as many x blocks as two
    waves hold, where their tiles fill 95 % of both waves with blocks of 112-176 rows
    (``wg.TWO_WAVES_MIN_FILL``); never over an even wave of two warpgroups."""
    assert h200_dispatch(512, 11008, 4096) == wg.WgmmaConfig(176, 128, 4, 1, True, 2, True)  # 3 x 86 = 258 tiles
    assert h200_dispatch(608, 8192, 8192) == wg.WgmmaConfig(160, 128, 4, 1, True, 2, True)  # 4 x 64 = 256 tiles
    assert wg.two_waves_config(256, 11008, 4096) is None  # 96-row blocks
    assert wg.two_waves_config(512, 6144, 4096) is None  # 5 x 48 = 240 tiles: 91 % of two waves
    assert wg.two_waves_config(448, 8192, 8192) is not None and h200_dispatch(448, 8192, 8192) == wg.WgmmaConfig(224, 64, 6, 1, True, 2, True)
    for m in range(1, nv.MAX_M_PER_LAUNCH + 1, 5):
        for n, k in ((11008, 4096), (8192, 8192), (4096, 11008), (5504, 4096)):
            c = wg.two_waves_config(m, n, k)
            if c is not None:
                tiles = n // wg.CTA_ROWS * -(-m // c.block_x)
                assert 0.95 * 264 <= tiles <= 264 and 112 <= c.block_x <= 176 and c.stages >= 4, (m, n, k, c)
                wg.check_wgmma_config(c, n, k)


def test_two_waves_rule_against_the_committed_h200_timings(whole_waves_in_16_row_steps, before_the_large_m_rules):
    """The two-wave rule was read off the H200 probe committed under results/ (each config raced and
    verified beside the dispatch's): in each of the six cells the dispatch takes it, the two-wave
    config was the fastest."""
    taken = 0
    for (n, k, m), times in committed_timings("h200_timings_2026-11-30w_whole_waves_probe.json").items():
        two = wg.two_waves_config(m, n, k)
        if two is not None and h200_dispatch(m, n, k) == two:
            assert min(times, key=times.get) == two, (n, k, m)
            taken += 1
    assert taken == 6


def untuned_run(name: str) -> dict:
    """``{(n, k, m): us}``, our fastest round per cell of a benchmark run committed under results/."""
    import json

    cells = json.loads((RESULTS / name).read_text())["cells"]
    return {(c["n"], c["k"], c["m"]): min(c["rounds"]["ours"]) for c in cells}


def committed_race_rows(*names: str) -> list:
    """The rows of scratch races committed under results/ (``{"note", "rows"}``: n, k, m, name, ok,
    best and the config), each checked to have passed the FP32 reference before it was timed."""
    import json

    rows = [row for name in names for row in json.loads((RESULTS / name).read_text())["rows"]]
    for row in rows:
        assert row["ok"], row
    return rows


def race_cells(*names: str) -> dict:
    """``{(race, n, k, m): {name: (config, best us)}}`` of ``committed_race_rows``."""
    cells = {}
    for row in committed_race_rows(*names):
        cells.setdefault((row["race"], row["n"], row["k"], row["m"]), {})[row["name"]] = (sk.config_from_json(row), row["best"])
    return cells


def changed_race_cells(name: str):
    """``(race, n, k, m, config, was_us, timed)`` for each cell of a committed race whose dispatch
    config (``config``) differs from its 'dispatch' row (timed at ``was_us``); ``timed``: config -> us."""
    for (race, n, k, m), times in race_cells(name).items():
        config = h200_dispatch(m, n, k)
        if config != times["dispatch"][0]:
            yield race, n, k, m, config, times["dispatch"][1], dict(times.values())


def test_whole_wave_rules_in_the_committed_untuned_runs(without_split_wave):
    """The untuned H200 benchmark runs before and after each whole-wave rule (all cells verified):
    every cell the two-wave rule takes (11008x4096 M = 304-512) and every cell the small-block one-wave
    rule takes over one warpgroup (4096x4096 M = 72-144) ran faster with it."""
    before, after = untuned_run("h200_untuned_2026-11-30w.json"), untuned_run("h200_untuned_2026-11-30x.json")
    two = [key for key in after if h200_dispatch(key[2], *key[:2]) == wg.two_waves_config(key[2], *key[:2])]
    assert len(two) == 4 and all(after[key] < 0.96 * before[key] for key in two)
    before, after = untuned_run("h200_untuned_2026-11-30x.json"), untuned_run("h200_untuned_2026-11-30y.json")
    small = [
        key for key in after
        if wg.one_wave_config(key[2], *key[:2]) is None
        and h200_dispatch(key[2], *key[:2]) == wg.one_wave_config(key[2], *key[:2], over_one_warpgroup=True)
    ]  # fmt: skip
    assert len(small) == 5 and all(after[key] < 0.9 * before[key] for key in small)


def test_tuner_offers_whole_wave_twins_where_tiles_outnumber_the_ctas():
    """``streamk_waves`` twins of the two-warpgroup producer stream-K candidates, one per distinct
    stream-K share short of every tile: none while the tiles fit one wave, both shares on 34816x5120
    at M = 1024 (1088 tiles of 256 rows: 32 and 164 shared), only the left-over one where a wave more
    would share every tile (5120x6144 M = 512: 160 tiles of 128 rows, 28 and 160)."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    def twins(m, n, k):
        return [c for c in tune.candidates(m, n, k, "sm_90") if getattr(c, "streamk_waves", 0)]

    assert twins(256, 5120, 6144) == []  # at most 80 tiles for 132 CTAs
    big = twins(1024, 34816, 5120)
    assert all(c.warpgroups == 2 and c.producer and c._replace(streamk_waves=0) in tune.candidates(1024, 34816, 5120, "sm_90") for c in big)
    assert {c.streamk_waves for c in big if c.block_x == 256 and c.block_k == 64} == {1, 2}
    assert {c.streamk_waves for c in twins(512, 5120, 6144) if c.block_x == 128} == {1}


@pytest.mark.parametrize("m, block_x, small_m", [(1, 16, True), (16, 16, True), (24, 32, True), (48, 48, True), (64, 64, False), (128, 128, False), (256, None, False)])
def test_tuner_offers_split_k_with_a_producer(m, block_x, small_m):
    """Two consumer warpgroups, a producer and 128-deep k tiles, split over every split that divides
    K's k tiles (5120x6144: 48 of them) into no fewer than the stages, at an x block of 8 rows per
    warpgroup or more. Above ``WGMMA_SMALL_M``: the deepest pipeline, up to SPLIT_PRODUCER_MAX_BLOCK_X
    rows. Up to it: SPLIT_PRODUCER_STAGES, TWO_WARPGROUP_STREAMK_STAGES and the deepest pipeline that
    the split's k tiles fill; and on one consumer warpgroup with two A batches, 6 stages
    (``ONE_WARPGROUP_SPLIT_PRODUCER_STAGES``) or as many as two CTAs per SM hold. (Their twins on
    8-row steps: ``test_tuner_offers_x_blocks_in_eight_row_steps``.)"""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    offered = [c for c in tune.candidates(m, 5120, 6144, "sm_90") if isinstance(c, wg.WgmmaConfig) and c.producer and c.split_k > 1]
    offered = [c for c in offered if not c.tail_k_tiles]  # their tail twins: test_tuner_offers_tails_where_two_warpgroup_splits_leave_sms_idle
    one_warpgroup = {c for c in offered if c.warpgroups == 1 and not c.tickets}
    pair_twins = set(tune.scale_pair_twins(one_warpgroup))  # test_tuner_offers_scale_pair_twins
    if small_m:
        stages = min(tune.ONE_WARPGROUP_SPLIT_PRODUCER_STAGES, wg.deepest_stages(block_x, 2, wg.DEEP_K))
        assert {c for c in one_warpgroup - pair_twins if c.block_x == block_x} == {wg.WgmmaConfig(block_x, 128, stages, s, True, 1, True, a_batches=2) for s in tune.WGMMA_SPLITS}
    else:
        assert not {c for c in one_warpgroup - pair_twins if c.block_x == block_x}
    offered = [c for c in offered if c.warpgroups == 2 or c.tickets]
    split = {c for c in offered if not c.tickets}
    # Each split config whose exchange would be marked also with tickets (``tune.ticket_twins``).
    marked = {c for c in split | one_warpgroup if c.split_plan.marked}
    assert {c for c in offered if c.tickets} == {c._replace(tickets=True) for c in marked}
    if block_x is None:
        assert not split
        return
    split = {c for c in split if c.block_x == block_x}
    deepest = wg.deepest_stages(block_x, ctas_per_sm=1, block_k=wg.DEEP_K)
    expected = set()
    for s in tune.WGMMA_SPLITS:
        k_tiles = 6144 // 128 // s
        for stages in (tune.SPLIT_PRODUCER_STAGES, tune.TWO_WARPGROUP_STREAMK_STAGES, min(deepest, k_tiles)) if small_m else (deepest,):
            if k_tiles >= stages:  # a stage per k tile of a split at most
                expected.add(wg.WgmmaConfig(block_x, 128, stages, s, True, 2, True))
    assert split == expected
    if small_m:  # 17 stages at 16 rows: split 3 gets one stage per k tile, 16
        assert wg.WgmmaConfig(block_x, 128, min(deepest, 16), 3, True, 2, True) in split and min(deepest, 16) > tune.SPLIT_PRODUCER_STAGES


def test_tuner_offers_scale_pair_twins():
    """Every one-warpgroup producer candidate (stream-K and split-K, two CTAs per SM) comes also with
    the producer's scale pairs at the deepest pipeline whose pairs fit and one stage shallower, never
    under SCALE_PAIR_MIN_STAGES, and at those depths without pairs; two-warpgroup configs never take
    pairs. The H200 table's entries of 2026-12-03l are among the candidates of their M."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    SK = sk.WgmmaStreamKConfig
    for m in (17, 24, 32, 40, 48, 64):
        offered = [c for c in tune.candidates(m, 34816, 5120, "sm_90") if isinstance(c, (wg.WgmmaConfig, SK))]
        assert not any(c.scale_pairs and (c.warpgroups != 1 or not c.producer) for c in offered)
        twins = set(tune.scale_pair_twins(offered))
        for c in (c for c in offered if c.warpgroups == 1 and c.producer and c not in twins):
            deepest = min(c.stages, wg.deepest_stages(c.block_x, 2, c.block_k, scale_pairs=True))
            depths = [s for s in (deepest, deepest - 1) if s >= wg.SCALE_PAIR_MIN_STAGES]
            assert depths and all(c._replace(stages=s, scale_pairs=True) in offered for s in depths)
            assert all(c._replace(stages=s) in offered for s in depths)
            if deepest < c.stages:  # the pairs cut the pipeline: a stage more would not fit two CTAs per SM
                deeper = c._replace(stages=deepest + 1, scale_pairs=True)
                assert 2 * wg.cta_smem(deeper) > wg.SM90_SMEM_PER_SM
    # 32 rows: 6 stages without pairs, 5 with (two CTAs of 116736 + 1024 bytes overflow 228 KB)
    assert wg.deepest_stages(32, 2, 128) == 6 and wg.deepest_stages(32, 2, 128, scale_pairs=True) == 5
    table = (
        (24, 34816, SK(24, 128, 5, 2, True, 1, True, 0, 2, True)),
        (32, 34816, SK(32, 128, 5, 2, True, 1, True, 0, 2)),
        (40, 34816, SK(40, 128, 5, 2, True, 1, True, 0, 2, True)),
        (24, 16384, wg.WgmmaConfig(24, 128, 5, 2, True, 1, True, a_batches=2, scale_pairs=True)),
        (32, 16384, wg.WgmmaConfig(32, 128, 5, 2, True, 1, True, a_batches=2, scale_pairs=True)),
        (24, 14336, wg.WgmmaConfig(24, 128, 5, 2, True, 1, True, a_batches=2, scale_pairs=True)),
    )
    for m, n, config in table:
        assert config in tune.candidates(m, n, 5120, "sm_90")


def test_tuner_offers_uneven_splits_by_tma_on_narrow_blocks():
    """Up to UNEVEN_SPLIT_TMA_MAX_BLOCK_X rows, one warpgroup's 128-deep split-K by TMA at
    UNEVEN_SPLIT_TMA_STAGES for every split, those that leave a remainder of k tiles included
    (5120x17408: 136 k tiles; splits 3, 6 and 8 do not divide them); none for wider blocks."""
    import tune_sm120_nvfp4_w4a16_gemm as tune

    def tma_splits(m):
        return {
            c.split_k
            for c in tune.candidates(m, 5120, 17408, "sm_90")
            if isinstance(c, wg.WgmmaConfig) and c.tma_loads and not c.producer and c.block_k == wg.DEEP_K and c.stages == tune.UNEVEN_SPLIT_TMA_STAGES
        }

    assert tma_splits(32) == set(tune.WGMMA_SPLITS) and any(17408 // 128 % s for s in tune.WGMMA_SPLITS)
    assert not tma_splits(48)


def test_split_k_tiles_cover_the_k_tiles_in_order():
    """Every split's k tiles follow the previous split's, the first ``k_tiles % split_k`` splits take
    one more, and together they are all the k tiles."""
    for k_tiles in range(1, 50):
        for split in range(1, k_tiles + 1):
            ranges = [wg.split_k_tiles(k_tiles, split, i) for i in range(split)]
            assert [kt0 for _, kt0 in ranges] == [sum(c for c, _ in ranges[:i]) for i in range(split)]
            assert sum(c for c, _ in ranges) == k_tiles
            assert [c for c, _ in ranges] == sorted((c for c, _ in ranges), reverse=True) and ranges[0][0] - ranges[-1][0] <= 1


def test_uneven_split_k_is_for_the_wgmma_kernel_only():
    """A split that leaves a remainder of k tiles fits the wgmma kernel (``UNEVEN_SPLIT_K``), not
    the example's kernels; every split still holds ``stages`` k tiles."""
    wg.check_wgmma_config(wg.WgmmaConfig(32, 128, 8, 3, True, 2, True), 5120, 17408)  # 45-46 k tiles per split
    with pytest.raises(ValueError, match="must divide K"):
        nv.check_config(nv.FragConfig(16, 128, 128, split_k=3), 5120, 17408)
    with pytest.raises(ValueError, match="at least `stages` k tiles"):
        wg.check_wgmma_config(wg.WgmmaConfig(32, 128, 13, 16, True, 2, True), 5120, 17408)  # 8-9 k tiles per split


def test_uneven_split_runs_each_count_with_a_static_trip_count():
    """Narrow x blocks (TWO_LOOPS_MAX_BLOCK_X) run the longer and the shorter splits' k loops with
    static trip counts (5120x17408 at split 3: 46 and 45 k tiles, the loop unrolled by two), with no
    spill and no serialized wgmma; wider ones one loop with a run-time count."""
    narrow = wg.WgmmaConfig(32, 128, 8, 3, True, 2, True)  # the H200 table's 5120x17408 M = 17-32
    assert narrow.block_x <= wg.TWO_LOOPS_MAX_BLOCK_X
    source = wg.compile_wgmma(5120, 17408, narrow).get_kernel_source()
    assert re.search(r"for \(int t2\w* = 0; t2\w* < 23;", source) and re.search(r"for \(int t2\w* = 0; t2\w* < 22;", source)
    report = ptxas_report(source)
    assert " 0 bytes spill stores" in report and "C7512" not in report and "C7513" not in report, report
    wide = wg.compile_wgmma(5120, 17408, narrow._replace(block_x=48)).get_kernel_source()
    assert not re.search(r"for \(int t2\w* = 0; t2\w* < 2[23];", wide) and re.search(r"for \(int t2\w* = 0; t2\w* < \(\w+ >> 1\);", wide)


def test_x_blocks_step_by_8_rows_for_wgmma_only():
    wg.check_wgmma_config(wg.WgmmaConfig(8, 64, 4), 4096, 4096)
    wg.check_wgmma_config(wg.WgmmaConfig(24, 64, 4), 4096, 4096)
    # Two warpgroups share the x block (one m64 atom of weight rows each), so the same 8-row steps.
    for block_x in (8, 24, 136, 264):
        wg.check_wgmma_config(wg.WgmmaConfig(block_x, 64, 4, warpgroups=2), 4096, 4096)
    sk.check_any_config(sk.WgmmaStreamKConfig(40, 128, 5, 1, True, 2, True), 5120, 17408, "sm_90")
    for warpgroups in (1, 2):
        with pytest.raises(ValueError, match="multiple of"):
            wg.check_wgmma_config(wg.WgmmaConfig(20, 64, 4, warpgroups=warpgroups), 4096, 4096)
    with pytest.raises(ValueError, match="multiple of 16"):
        nv.check_config(nv.FragConfig(block_m=8), 4096, 4096)


def test_refuses_other_archs(monkeypatch):
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(128, 256))
    monkeypatch.setattr(nv, "device_arch", lambda device: "sm_120")
    with pytest.raises(ValueError, match="sm_90 only"):
        wg.launch_wgmma(torch.zeros(1, 256, dtype=torch.bfloat16), w, wg.WgmmaConfig(), torch.empty(1, 128, dtype=torch.bfloat16))


@pytest.mark.parametrize(
    "config",
    [
        wg.WgmmaConfig(block_k=256),
        wg.WgmmaConfig(block_x=12),
        wg.WgmmaConfig(block_x=368, warpgroups=2),  # over MAX_BLOCK_X (accumulators)
        wg.WgmmaConfig(block_x=144),  # over 128 rows needs two warpgroups
        wg.WgmmaConfig(warpgroups=3),
        wg.WgmmaConfig(stages=2),
        wg.WgmmaConfig(tma_loads=1),
        wg.WgmmaConfig(split_k=True),
        wg.WgmmaConfig(block_x=104, block_k=128, stages=3),  # 104 accumulators + 128 A registers: ptxas serializes
        wg.WgmmaConfig(block_x=128, block_k=128, stages=3),
        wg.WgmmaConfig(256, tma_loads=False, warpgroups=2, producer=True),  # a producer issues TMA only
        wg.WgmmaConfig(256, tma_loads=True, warpgroups=2, producer=1),
        wg.WgmmaConfig(32, 128, 5, tickets=True),  # an exchange choice without a split
        wg.WgmmaConfig(32, 128, 5, split_k=2, tickets=1),
        wg.WgmmaConfig(32, 128, 5, a_batches=3),  # batches divide a k tile's four k32 blocks
        wg.WgmmaConfig(32, 64, 5, a_batches=4),  # ... or two
        wg.WgmmaConfig(32, 128, 5, a_batches=0),
        wg.WgmmaConfig(32, 128, 5, tma_loads=True, scale_pairs=True),  # the producer makes the pairs
        wg.WgmmaConfig(32, 128, 5, 3, tail_k_tiles=32),  # the tails leave nothing to split
        wg.WgmmaConfig(32, 128, 5, 3, tail_k_tiles=18),  # ... or splits of fewer than `stages` k tiles
        wg.WgmmaConfig(32, 128, 5, 3, tail_k_tiles=4, tails_per_cta=33),  # 32 weight tiles
        wg.WgmmaConfig(32, 128, 5, 3, tail_k_tiles=-1),
        wg.WgmmaConfig(32, 128, 5, 3, True, 2, True, tickets=True, tail_k_tiles=4, tails_per_cta=4),  # tails post, never wait: the marked exchange
        wg.WgmmaConfig(32, 128, 5, 3, True, 1, True, tail_k_tiles=4, tails_per_cta=4),  # 32 accumulators x 4 pieces: past the marked form
    ],
)
def test_bad_configs(config):
    with pytest.raises(ValueError):
        wg.check_wgmma_config(config, 4096, 4096)


@pytest.mark.parametrize("n, k, split, tail, per_cta", [(5120, 17408, 3, 10, 4), (640, 2560, 2, 3, 2), (640, 2304, 3, 4, 3), (5120, 6144, 3, 3, 4)])
def test_tails_and_splits_cover_every_k_tile_once(n, k, split, tail, per_cta):
    """With ``tail_k_tiles`` each (weight tile, k tile) is run by one CTA: a split of the k tiles
    before the tail (``split_k_tiles``) or the tail CTA of ``tail_pieces``; the grid launches
    ``wgmma_ctas`` of them, tail CTAs first, and every split holds at least ``stages`` k tiles."""
    config = wg.WgmmaConfig(32, 128, 4, split, True, 2, True, tail_k_tiles=tail, tails_per_cta=per_cta)
    wg.check_wgmma_config(config, n, k)
    tiles, k_tiles = n // wg.CTA_ROWS, k // 128
    runs = collections.Counter()
    for t in range(tiles):
        for i in range(split):
            count, kt0 = wg.split_k_tiles(k_tiles - tail, split, i)
            runs.update((t, kt) for kt in range(kt0, kt0 + count))
    for cta in range(wg.tail_ctas(config, n)):
        first, count = wg.tail_pieces(config, n, cta)
        assert 1 <= count <= per_cta
        runs.update((t, kt) for t in range(first, first + count) for kt in range(k_tiles - tail, k_tiles))
    assert runs == collections.Counter((t, kt) for t in range(tiles) for kt in range(k_tiles))
    assert wg.wgmma_ctas(config, 32, n) == tiles * split + -(-tiles // per_cta)
    assert config.split_plan.split_k == split + 1  # the tail is one more piece of each tile's exchange


def test_tickets_choose_the_ticket_exchange():
    """24 rows at split 3 (5120x17408's tuned M = 17-24 shape) exchange marked by default: posts and
    one take, no atomic; with ``tickets`` through the atomic ticket and no marked piece."""
    config = wg.WgmmaConfig(24, 128, 8, 3, True, 2, True)
    for tickets in (False, True):
        source = wg.compile_wgmma(5120, 17408, config._replace(tickets=tickets)).get_kernel_source()
        body = source[source.index("__global__") :]
        assert ("AtomicAdd" in body) == tickets
        assert ("nvfp4_take_partials<" in body) == ("nvfp4_post_partials<" in body) == (not tickets)
        assert config._replace(tickets=tickets).split_plan.marked == (not tickets)  # what the launcher prepares


@pytest.mark.parametrize("block_x, warpgroups", [(8, 1), (64, 1), (128, 1), (16, 2), (128, 2), (144, 2), (256, 2), (272, 2), (320, 2), (352, 2)])
def test_each_warp_stores_the_rows_it_dequantizes(block_x, warpgroups):
    """The layout side of both warpgroup shapes, on the CPU: the weight rows a warp's dequant covers
    (words 2 * part .. of its block, word j feeding row 8j + g) are the rows its accumulators are
    stored to (``w_row``); and the x rows of a thread's accumulators cover the x block once."""
    wgs = warpgroups
    pipe = wg.wgmma_pipeline(block_x, 4, block_x >= wg.TMA_BLOCK_X, wgs)
    assert pipe.threads == wgs * wg.WARPGROUP_THREADS and pipe.acc_size == wg.ATOMS // wgs * block_x // 2
    stored = set()
    for warp in range(pipe.threads // 32):
        block, part = wg.warp_words(warp, wgs)
        words = range(2 * part, 2 * part + 4 // wgs)
        for lane in range(32):
            dequantized = {32 * block + 8 * j + lane // 4 for j in words}
            rows = {(pipe.w_row(q, 0, lane, warp), pipe.x_row(q, 0, lane)) for q in range(pipe.acc_size)}
            assert {w for w, _ in rows} == dequantized, (warp, lane)
            stored |= rows
    assert pipe.threads * pipe.acc_size == wg.CTA_ROWS * block_x  # so the cover below is one-to-one
    assert stored == {(w, x) for w in range(wg.CTA_ROWS) for x in range(block_x)}


def test_heuristic_x_block_is_the_tightest_cover(without_split_wave):
    """The weights are dequantized once per x block: the fewest blocks of <= 128 rows with one
    warpgroup, <= 256 with two, each as small as that allows (M = 72 is one 80-row block, M = 144
    one of 144 rows on two warpgroups, M = 384 two of 192 rows on two where their tiles spread
    evenly over the SMs, else three of 128 rows on one). Up to 128 rows the split-wave rule
    comes first and takes 16384x5120's 128 tiles (``test_heuristic_split_wave``)."""
    for m in range(wg.SMALL_M, nv.MAX_M_PER_LAUNCH + 1):
        c = wg.get_wgmma_config(m, 16384, 5120)
        most = wg.HEURISTIC_MAX_BLOCK_X if c.warpgroups == 2 else wg.ONE_WARPGROUP_MAX_BLOCK_X
        blocks = -(-m // c.block_x)
        assert c.block_x % 16 == 0 and c.block_x <= most and blocks == -(-m // most), (m, c)
        assert c.block_x - 16 < -(-m // blocks)  # a block 16 rows smaller would not cover M in as many blocks
    assert [wg.get_wgmma_config(m, 16384, 5120).block_x for m in (64, 72, 128, 144, 384, 416, 1024)] == [64, 80, 128, 144, 192, 208, 256]
    assert wg.get_wgmma_config(384, 4096, 4096).block_x == 128  # two warpgroups' 64 tiles: uneven


def test_heuristic_two_warpgroups():
    """Two warpgroups above 128 rows: always up to 256, and beyond where one warpgroup's blocks would
    be under 128 rows, where two warpgroups' tiles load the SMs evenly, or where one warpgroup's
    tiles run past one wave of two CTAs per SM; no split and the deepest one-CTA pipeline, or stream-K at one CTA per SM where
    the CTAs load the SMs unevenly (the H200 timings at ``takes_two_warpgroups``), each with the
    producer warpgroup (``TWO_WARPGROUP_PRODUCER``). The two shapes
    here have enough k tiles per SM and no single full wave of one-warpgroup tiles: no exception.
    Where the split-wave rule applies (up to 176 rows on both, to 352 on 5120x6144) both take its two
    warpgroups (``test_heuristic_split_wave``)."""
    for m in range(wg.HEURISTIC_MIN_M, nv.MAX_M_PER_LAUNCH + 1):
        for n, k in ((16384, 5120), (5120, 6144)):
            c = wg.get_wgmma_config(m, n, k)
            split_wave = wg.split_wave_config(m, n, k)
            assert (split_wave is not None) == (m <= (wg.SPLIT_WAVE_MAX_BLOCK_X if n == 16384 else wg.SPLIT_WAVE_MAX_M)), (m, n, k)
            if split_wave is not None:
                assert c == split_wave and c.warpgroups == 2, (m, n, k, c)
                continue
            one = wg.tight_wgmma_config(m, n, k)
            even = not wg.two_warpgroup_tiles_load_sms_unevenly(m, n, k, 132)
            past_one_wave = n // 128 * -(-m // one.block_x) > 264
            assert (c.warpgroups == 2) == (m > 128 and (m <= 256 or one.block_x < wg.TMA_BLOCK_X or even or past_one_wave)), (m, n, k, c)
            if c.warpgroups == 2:
                assert c == wg.WgmmaConfig(c.block_x, 64, min(wg.deepest_stages(c.block_x, ctas_per_sm=1), k // 64), 1, True, 2, True)
            dispatched = h200_dispatch(m, n, k)
            sk.check_any_config(dispatched, n, k, "sm_90")
            if isinstance(dispatched, sk.WgmmaStreamKConfig):  # two warpgroups from SMALL_M (the next test)
                two = m >= sk.STREAMK_TWO_WARPGROUPS_MIN_M
                assert dispatched.warpgroups == (2 if two else 1) and dispatched.ctas_per_sm == (1 if two else 2)
                assert dispatched.producer == two and dispatched.tma_loads == (two or c.tma_loads)
    assert wg.get_wgmma_config(192, 16384, 5120) == wg.WgmmaConfig(192, 64, 7, 1, True, 2, True)  # 128 CTAs, one wave
    # 40 CTAs (the one-wave rule leaves 64-row blocks past K = 6144 alone: wg.ONE_WAVE_MAX_K)
    assert h200_dispatch(192, 5120, 17408) == sk.WgmmaStreamKConfig(192, 64, 4, 1, True, 2, True)
    # Beyond 256 rows, the configs the tuner took on these shapes (tuned/sm_90-132sm.json): 16384x5120
    # M = 512 on 128 CTAs, 5120x6144 M = 768 on 120; M = 512 there (80 CTAs) keeps one warpgroup.
    assert wg.get_wgmma_config(512, 16384, 5120) == wg.WgmmaConfig(256, 64, 6, 1, True, 2, True)
    assert wg.get_wgmma_config(768, 5120, 6144) == wg.WgmmaConfig(256, 64, 6, 1, True, 2, True)
    assert wg.get_wgmma_config(512, 5120, 6144).warpgroups == 1


def test_streamk_two_warpgroups_against_the_committed_h200_runs(without_one_wave, without_split_wave, without_two_block_streamk, before_the_large_m_rules):
    """From M = 64 the dispatch's wgmma stream-K runs two consumer warpgroups with a producer
    (sk.STREAMK_TWO_WARPGROUPS_MIN_M). The two committed H200 runs of the untuned shapes, before (one
    warpgroup) and after, both verified, time each of the 21 cells where that changes the dispatch
    (10 at M = 64-128, 11 above, where the heuristic keeps one warpgroup's x blocks), and every one
    got faster (0.78-0.94x)."""
    before, after = untuned_run("h200_untuned_2026-11-30i.json"), untuned_run("h200_untuned_2026-11-30j.json")
    taken = []
    for (n, k, m), us in after.items():
        c = h200_dispatch(m, n, k)
        if isinstance(c, sk.WgmmaStreamKConfig) and wg.get_wgmma_config(m, n, k).warpgroups == 1 and m >= wg.SMALL_M:
            assert c == sk.WgmmaStreamKConfig(c.block_x, wg.DEEP_K, 4, 1, True, 2, True)
            assert us < 0.95 * before[(n, k, m)], (n, k, m)
            taken.append(m)
    assert len(taken) == 20 and sum(m <= 128 for m in taken) == 10  # the 21st, 11008x4096 M = 608, now takes two
    # warpgroups' split-K (``test_two_warpgroups_on_even_tiles_against_the_committed_h200_timings``)


def test_heuristic_two_warpgroup_exceptions(without_split_wave):
    """One warpgroup where two would have under 20 k tiles per SM (4096x4096 M <= 256: 32 tiles of 64
    k tiles), or where two need stream-K while one warpgroup's unsplit tiles fill one wave of two CTAs
    per SM (11008x4096 M = 272 and 304: 258 tiles); both lost on the H200 (``takes_two_warpgroups``)."""
    for m in (144, 192, 256):
        assert wg.get_wgmma_config(m, 4096, 4096).warpgroups == 1
        assert wg.get_wgmma_config(m, 4096, 11008).warpgroups == 2  # 172 k tiles: 42 per SM
        assert wg.get_wgmma_config(m, 6144, 4096).warpgroups == 2  # 48 tiles: 23 per SM
    for m in (272, 304):
        assert wg.get_wgmma_config(m, 11008, 4096).warpgroups == 1
        assert wg.get_wgmma_config(m, 4096, 4096).warpgroups == 2  # 64 tiles of one warpgroup: half a wave
    assert wg.get_wgmma_config(256, 16384, 5120).warpgroups == 2  # 128 tiles: two warpgroups spread evenly
    assert all(wg.get_wgmma_config(m, 640, 2304).warpgroups == 1 for m in range(129, nv.MAX_M_PER_LAUNCH + 1, 16))


def test_heuristic_two_warpgroups_past_one_wave_of_128_row_blocks():
    """Past 256 rows, where one warpgroup's 128-row blocks would run past one wave of two CTAs per SM
    (``wg.ONE_WARPGROUP_MAX_WAVES``), two warpgroups' tight blocks, as stream-K where their tiles load
    the SMs unevenly."""
    assert h200_dispatch(833, 6144, 4096) == sk.WgmmaStreamKConfig(224, 64, 4, 1, True, 2, True)  # 7 x 48 = 336 blocks of 128 rows
    assert h200_dispatch(449, 12288, 8192) == sk.WgmmaStreamKConfig(240, 64, 4, 1, True, 2, True)  # 4 x 96 = 384
    assert wg.get_wgmma_config(608, 6144, 4096).warpgroups == 1  # 5 x 48 = 240: one wave
    assert h200_dispatch(832, 10240, 4096) == sk.WgmmaStreamKConfig(208, 64, 4, 1, True, 2, True)  # 7 x 80 = 560: past two waves
    two = {True: 0, False: 0}
    for m in range(wg.SPLIT_WAVE_MAX_M + 1, nv.MAX_M_PER_LAUNCH + 1, 8):  # the split wave comes first up to there
        for n in (6144, 7168, 10240, 12288, 18944):
            one = wg.tight_wgmma_config(m, n, 4096)
            waves = n // 128 * -(-m // one.block_x) / 264
            if one.block_x == wg.TMA_BLOCK_X and wg.two_warpgroup_tiles_load_sms_unevenly(m, n, 4096, 132):
                assert (wg.get_wgmma_config(m, n, 4096).warpgroups == 2) == (waves > 1), (m, n)
                two[waves > 1] += 1
    assert min(two.values()) >= 10, two


def test_heuristic_wide_one_wave():
    """Where the one wave's x blocks are too wide for four 128-deep stages (over 176 rows), 64-deep
    tiles of up to 352 rows, where the tiles fill at least 84 % of the SMs (``wg.WIDE_ONE_WAVE_MIN_FILL``)."""
    assert h200_dispatch(929, 3072, 4096) == wg.WgmmaConfig(192, 64, 7, 1, True, 2, True)  # 5 x 24 = 120 tiles
    assert h200_dispatch(1017, 5120, 4096) == wg.WgmmaConfig(344, 64, 4, 1, True, 2, True)  # 3 x 40 = 120
    assert h200_dispatch(577, 7168, 4096) == wg.WgmmaConfig(296, 64, 5, 1, True, 2, True)  # 2 x 56 = 112: 85 %
    assert wg.one_wave_config(897, 4608, 4096) is None  # 3 x 36 = 108 tiles: 82 %
    assert wg.one_wave_config(705, 6144, 4096) is None  # 2 x 48 = 96: 73 %
    wide = 0
    for m in range(177, nv.MAX_M_PER_LAUNCH + 1, 8):
        for n, k in ((3072, 4096), (4096, 14336), (5120, 8192), (6144, 4096), (7168, 4096), (8192, 2048)):
            c = wg.one_wave_config(m, n, k)
            if c is not None and c.block_k == wg.SWIZZLE_K:
                assert wg.whole_tiles_config(c.block_x, k) is None and c == wg.whole_tiles_config(c.block_x, k, block_k=wg.SWIZZLE_K)
                assert n // 128 * -(-m // c.block_x) >= 0.84 * 132 and 176 < c.block_x <= wg.MAX_BLOCK_X, (m, n, k, c)
                wg.check_wgmma_config(c, n, k)
                wide += 1
    assert wide > 100


def test_large_m_rules_against_the_committed_h200_race():
    """The H200 races committed under results/ (3 rounds, every config checked against the FP32
    reference) hold 50f8361's dispatch ('dispatch') and, in 'rules', the configs of the wide one
    wave and of two warpgroups past one wave of 128-row blocks (then up to two waves); in
    'past_two_waves' f56ea4e's dispatch and two warpgroups past two waves; 'held_out' both rules on
    twelve shapes raced nowhere else. 62 cells change; the 58 that timed the new config all ran
    faster but 10240x4096 M = 481 (1.013x: stream-K over 256-row blocks against 128-row ones) and
    13824x4096 M = 640 (1.002x)."""
    changed, timed_faster, slower = 0, 0, {}
    for race, n, k, m, config, was_us, timed in changed_race_cells("h200_ab_2026-12-02n_large_m.json"):
        changed += 1
        if config in timed:
            if timed[config] < was_us:
                timed_faster += 1
            else:
                slower[(n, k, m)] = timed[config] / was_us
    assert changed == 62 and timed_faster == 56
    assert slower.keys() == {(10240, 4096, 481), (13824, 4096, 640)} and max(slower.values()) < 1.02


def test_heuristic_loads_by_tma_from_tma_block_x():
    """TMA won with 128-row x blocks and lost with smaller ones (H200): the loader follows the block,
    except under the split-wave rule's producer warpgroup, which loads by TMA only."""
    for m in range(wg.HEURISTIC_MIN_M, nv.MAX_M_PER_LAUNCH + 1, 7):
        for n, k in ((16384, 5120), (4096, 4096), (5120, 6144), (34816, 5120)):
            config = wg.get_wgmma_config(m, n, k)
            one_wave = wg.split_wave_config(m, n, k) is not None
            assert config.tma_loads == (one_wave or config.block_x >= wg.TMA_BLOCK_X), (m, n, k, config)
    assert wg.get_wgmma_config(1024, 16384, 5120).tma_loads and not wg.get_wgmma_config(72, 34816, 5120).tma_loads


def test_heuristic_deepens_tma_configs_whose_ctas_each_get_an_sm(without_split_wave):
    """128 CTAs of 128-row TMA blocks (16384x5120 M = 128) take LONE_CTA_TMA_STAGES; 240 (6144x4096
    M = 608) share SMs and keep the default; cp.async configs keep it too. (The split-wave rule
    comes first up to 128 rows; this rule decides past them, e.g. 2048x4096 at M = 561-1024.)"""
    assert wg.get_wgmma_config(128, 16384, 5120) == wg.WgmmaConfig(128, 64, wg.LONE_CTA_TMA_STAGES, 1, True)
    assert wg.get_wgmma_config(608, 6144, 4096) == wg.WgmmaConfig(128, 64, wg.DEFAULT_STAGES, 1, True)
    assert wg.get_wgmma_config(96, 16384, 5120).stages == wg.DEFAULT_STAGES  # 96-row blocks load by cp.async
    for m in range(wg.SMALL_M, nv.MAX_M_PER_LAUNCH + 1, 29):
        for n, k in ((16384, 5120), (640, 2304), (5120, 1024)):
            config = wg.get_wgmma_config(m, n, k)
            wg.check_wgmma_config(config, n, k)


def test_heuristic_takes_64_row_blocks_where_the_tight_block_leaves_most_sms_idle(without_split_wave):
    """4096x4096 has 32 weight tiles: one 128-row x block at M = 128 gives 64 CTAs even split twice;
    two 64-row blocks give 128. Shapes with many tiles keep the tight block. (The split-wave
    rule, which comes first, takes 4096x4096 up to 128 rows; this is the rule under it.)"""
    assert wg.get_wgmma_config(128, 4096, 4096) == wg.WgmmaConfig(64, 64, wg.DEFAULT_STAGES, 2)
    assert wg.get_wgmma_config(128, 11008, 4096).block_x == 128
    for m in range(wg.HEURISTIC_MIN_M, nv.MAX_M_PER_LAUNCH + 1, 8):
        c = wg.get_wgmma_config(m, 4096, 4096)
        if c.warpgroups == 1:  # two warpgroups leave the balance to stream-K (test_heuristic_two_warpgroups)
            assert 2 * (4096 // wg.CTA_ROWS) * -(-m // c.block_x) * c.split_k >= 132 or c.block_x == wg.NARROW_BLOCK_X


# The split-wave rule's split per shape: the most that keeps a CTA per SM (132) and 1024 k per split.
SPLIT_WAVE_SPLITS = {
    (4096, 4096): 4,  # 32 tiles: 128 CTAs
    (4096, 11008): 4,
    (6144, 4096): 2,  # 48 tiles: 96 CTAs (144 would not fit)
    (11008, 4096): 1,  # 86 tiles
    (16384, 5120): 1,
    (14336, 5120): 1,
    (5120, 17408): 3,  # 40 tiles: 120 CTAs
    (5120, 6144): 3,
    (640, 2304): 2,  # 5 tiles: 2304 k holds two splits of 1024
}


def test_heuristic_two_cta_split_wave():
    """At M = 17-32, where 67-132 weight tiles fill two CTAs per SM split 2 or 3 ways: one consumer
    warpgroup, a producer with the scale pairs, two A batches, 128-deep k tiles by TMA, 5 stages,
    the x block in 8-row steps; the dispatch runs it ahead of the split wave. Not on fewer tiles
    (a split of 4 or more), more tiles than SMs, K in 64-deep tiles, under 5 k tiles a split, or
    outside those M."""
    for (n, k), split in ((11008, 4096), 3), ((16384, 5120), 2), ((14336, 5120), 2), ((8576, 4096), 3):
        for m in range(wg.HEURISTIC_MIN_M, wg.TWO_CTA_SPLIT_WAVE_MAX_M + 1):
            expected = wg.WgmmaConfig(8 * -(-m // 8), 128, 5, split, True, 1, True, a_batches=2, scale_pairs=True)
            assert wg.two_cta_split_wave_config(m, n, k) == expected and h200_dispatch(m, n, k) == expected, (m, n, k)
            sk.check_any_config(expected, n, k, "sm_90")
            assert 2 * 132 - n // wg.CTA_ROWS < n // wg.CTA_ROWS * split <= 2 * 132  # another split would not fit
        assert wg.two_cta_split_wave_config(wg.HEURISTIC_MIN_M - 1, n, k) is None
        assert wg.two_cta_split_wave_config(wg.TWO_CTA_SPLIT_WAVE_MAX_M + 1, n, k) is None
        assert h200_dispatch(wg.TWO_CTA_SPLIT_WAVE_MAX_M + 1, n, k).warpgroups == 2
    for n, k in ((8448, 4096), (6144, 4096), (4096, 4096), (4096, 11008), (5120, 17408), (34816, 5120), (17024, 5120), (11008, 4160), (11008, 1152)):
        assert all(wg.two_cta_split_wave_config(m, n, k) is None for m in (17, 24, 32)), (n, k)


def test_heuristic_two_cta_split_wave_against_the_committed_h200_race():
    """The H200 race committed under results/ (the untuned shapes at M = 24 and 32, 5 rounds, every
    config checked against the FP32 reference): where the rule applies (11008x4096, 86 tiles) its
    config was the fastest raced, 0.84-0.90x the split wave's time before it; on the three shapes of
    32-48 tiles, which it leaves to the split wave, every one-warpgroup split lost to the split wave."""
    cells = {}
    for row in committed_race_rows("h200_ab_2026-12-03l_heuristic_one_warpgroup_split.json"):
        cells.setdefault((row["n"], row["k"], row["m"]), {})[row["name"]] = (sk.config_from_json(row), row["best"])
    assert len(cells) == 8
    for (n, k, m), times in cells.items():
        before, before_us = times["heuristic"]
        rule = wg.two_cta_split_wave_config(m, n, k)
        fastest = min(us for _, us in times.values())
        if n == 11008:
            (rule_us,) = [us for c, us in times.values() if c == rule]
            assert rule_us == fastest and 0.84 < rule_us / before_us < 0.90, (n, k, m)
        else:
            assert rule is None and h200_dispatch(m, n, k) == before
            assert all(us > before_us for name, (_, us) in times.items() if name.startswith("one_warpgroup_split")), (n, k, m)


def test_heuristic_split_wave(without_two_block_split_wave):
    """At M = 17-176, where the weight tiles number no more than the SMs and K is whole 128-deep
    tiles: two consumer warpgroups and a producer, TMA, 128-deep k tiles, the x block in 8-row steps,
    the split of SPLIT_WAVE_SPLITS and the deepest pipeline a split's k tiles allow. Below
    SMALL_M the dispatch runs it as it is; from there as it is where its CTAs keep all but a sixth of
    the SMs busy, else as two-warpgroup stream-K of the same tiles (over the same 8-row-step block),
    ahead of whole x blocks that fill a wave up to 144 rows (from 145 behind those of 64 rows or more:
    ``ONE_WAVE_FIRST_MIN_BLOCK_X``), and past 128 rows
    ahead of two warpgroups' tight blocks. Not below M = 17, not past 176 rows, not with more tiles
    than SMs (34816x5120: 272) or K in 64-deep tiles only (4160)."""
    for (n, k), split in SPLIT_WAVE_SPLITS.items():
        for m in range(wg.HEURISTIC_MIN_M, wg.SPLIT_WAVE_MAX_BLOCK_X + 1):
            block_x = 8 * -(-m // 8)
            stages = min(wg.deepest_stages(block_x, ctas_per_sm=1, block_k=wg.DEEP_K), k // wg.DEEP_K // split)
            expected = wg.WgmmaConfig(block_x, wg.DEEP_K, stages, split, True, 2, True)
            assert wg.split_wave_config(m, n, k) == wg.get_wgmma_config(m, n, k) == expected, (m, n, k)
            wg.check_wgmma_config(expected, n, k)
            dispatched = h200_dispatch(m, n, k)
            one_wave = wg.one_wave_config(m, n, k)
            whole_blocks_first = m > wg.SPLIT_WAVE_FIRST_MAX_M and one_wave is not None and one_wave.block_x >= wg.ONE_WAVE_FIRST_MIN_BLOCK_X
            few_ctas = (n // wg.CTA_ROWS) * split <= wg.FEW_CTAS_MAX_FILL * 132  # the narrow split wave's (test_heuristic_narrow_split_wave)
            two_ctas = wg.two_cta_split_wave_config(m, n, k) is not None  # test_heuristic_two_cta_split_wave
            if (m < wg.SMALL_M or 6 * (n // wg.CTA_ROWS) * split >= 5 * 132) and not (whole_blocks_first or few_ctas or two_ctas):
                assert dispatched == expected, (m, n, k)
        assert wg.split_wave_config(wg.HEURISTIC_MIN_M - 1, n, k) is None
        assert wg.split_wave_config(wg.SPLIT_WAVE_MAX_M + 1, n, k) is None
    assert all(wg.split_wave_config(m, n, k) is None for m in (17, 40, 63, 96) for n, k in ((34816, 5120), (4096, 4160)))
    # From SMALL_M, 96 and 86 CTAs leave over a sixth of the SMs idle: stream-K over the same tiles.
    assert h200_dispatch(96, 6144, 4096) == sk.WgmmaStreamKConfig(96, 128, 4, 1, True, 2, True)
    assert h200_dispatch(72, 11008, 4096) == sk.WgmmaStreamKConfig(72, 128, 4, 1, True, 2, True)
    # As stream-K the 8-row-step block stays (NARROW_STREAMK_BLOCK_X only narrows wider blocks)
    assert h200_dispatch(113, 6144, 4096) == sk.WgmmaStreamKConfig(120, 128, 4, 1, True, 2, True)
    # Before whole 64-row blocks where M = 97-128 cuts into two of them that fill one wave
    assert wg.one_wave_config(128, 6144, 4096) == wg.WgmmaConfig(64, 128, 9, 1, True, 2, True)
    assert h200_dispatch(128, 6144, 4096) == sk.WgmmaStreamKConfig(128, 128, 4, 1, True, 2, True)
    assert wg.one_wave_config(104, 8192, 4096) == wg.WgmmaConfig(56, 128, 9, 1, True, 2, True)
    assert h200_dispatch(104, 8192, 4096) == wg.WgmmaConfig(104, 128, 6, 2, True, 2, True)
    # 3072x4096 M = 128: 96 CTAs, but too few k tiles for stream-K (the rule's one loss in its race)
    assert h200_dispatch(128, 3072, 4096) == wg.WgmmaConfig(128, 128, 5, 4, True, 2, True)
    assert wg.split_wave_config(24, 4096, 4096, sm_count=66) == wg.WgmmaConfig(24, 128, 15, 2, True, 2, True)  # 64 CTAs
    # Past 128 rows, ahead of two warpgroups' tight blocks (48 rows x 3 on 4096x4096, stream-K over
    # 144 rows 64 deep on 11008x4096); from 177 rows two x blocks (test_heuristic_split_wave_two_blocks).
    assert h200_dispatch(144, 4096, 4096) == wg.WgmmaConfig(144, 128, 5, 4, True, 2, True)
    assert h200_dispatch(144, 11008, 4096) == sk.WgmmaStreamKConfig(144, 128, 4, 1, True, 2, True)
    assert h200_dispatch(176, 4096, 11008) == wg.WgmmaConfig(176, 128, 4, 4, True, 2, True)
    # From 145 rows whole x blocks that fill one wave come first (6144x4096: two 80-row blocks)
    assert h200_dispatch(152, 6144, 4096) == wg.one_wave_config(152, 6144, 4096)


# Two x blocks of the split-wave rule (M = 177-352): the split per shape, or None where it does not
# apply (more tiles than SMs; a split's K outside SPLIT_WAVE_TWO_BLOCKS_MIN_SPLIT_K to _MAX_SPLIT_K).
SPLIT_WAVE_TWO_BLOCK_SPLITS = {
    (4096, 4096): 2,  # 64 tiles: 128 CTAs
    (4096, 11008): 2,  # 5504 k per split
    (2560, 8192): 3,  # 40 tiles: 120 CTAs
    (5120, 6144): 1,  # 80 tiles
    (8192, 8192): 1,  # 128 tiles, all of K (8192) per CTA
    (11008, 4096): None,  # 172 tiles
    (8192, 28672): None,  # 28672 k per CTA
    (3584, 18944): None,  # 56 tiles split 2: 9472 k per CTA
    (1536, 8960): 5,  # 1792 k per split
    (1024, 4096): None,  # 16 tiles split 4: 1024 k per split
    (1536, 4096): None,  # 24 tiles split 4: 1024
    (1024, 8192): None,  # 16 tiles split 8: 1024
}


def test_heuristic_split_wave_two_blocks():
    """From 177 to 352 rows the split-wave rule cuts M into two x blocks of at most
    SPLIT_WAVE_MAX_BLOCK_X rows (8-row steps), split as far as one wave holds, where each CTA keeps
    SPLIT_WAVE_TWO_BLOCKS_MIN_SPLIT_K to _MAX_SPLIT_K of K. The dispatch asks it
    after whole x blocks of 64 rows or more that fill one wave (``one_wave_config``), else first."""
    for (n, k), split in SPLIT_WAVE_TWO_BLOCK_SPLITS.items():
        for m in range(wg.SPLIT_WAVE_MAX_BLOCK_X + 1, wg.SPLIT_WAVE_MAX_M + 1):
            c = wg.split_wave_config(m, n, k)
            if split is None:
                assert c is None, (m, n, k)
                continue
            block_x = 8 * -(-m // 16)
            stages = min(wg.deepest_stages(block_x, ctas_per_sm=1, block_k=wg.DEEP_K), k // wg.DEEP_K // split)
            assert c == wg.WgmmaConfig(block_x, wg.DEEP_K, stages, split, True, 2, True), (m, n, k)
            one_wave = wg.one_wave_config(m, n, k)
            dispatched = h200_dispatch(m, n, k)
            if one_wave is not None and one_wave.block_x >= wg.ONE_WAVE_FIRST_MIN_BLOCK_X:
                assert dispatched == one_wave, (m, n, k)
            elif 6 * 2 * (n // wg.CTA_ROWS) * split >= 5 * 132:
                assert dispatched == c, (m, n, k)
            else:  # a sixth of the SMs idle or more: stream-K over the same tiles
                assert dispatched == sk.WgmmaStreamKConfig(block_x, wg.DEEP_K, 4, 1, True, 2, True), (m, n, k)
        assert wg.split_wave_config(wg.SPLIT_WAVE_MAX_M + 1, n, k) is None
    # 4096x4096: four whole blocks of 56 rows at M = 208 come after it, of 64 at M = 232 before it
    assert h200_dispatch(208, 4096, 4096) == wg.WgmmaConfig(104, 128, 6, 2, True, 2, True)
    assert h200_dispatch(232, 4096, 4096) == wg.one_wave_config(232, 4096, 4096)
    assert wg.one_wave_config(232, 4096, 4096).block_x == 64


def test_heuristic_split_wave_against_the_committed_h200_race(without_two_cta_split_wave):
    """The H200 race committed under results/ (untuned shapes, M = 17-56, 3 rounds, every config
    checked against the FP32 reference) holds, per cell, the dispatch's config before this rule, this
    rule's config, the next lower split and both stream-K forms of the same tiles: this rule's config
    passed, beat the one before it in all 24 cells (0.72-0.94x) and came within 5 % of the fastest."""
    cells = {}
    for row in committed_race_rows("h200_ab_2026-12-02h_small_m_one_wave.json"):
        cells.setdefault((row["n"], row["k"], row["m"]), {})[sk.config_from_json(row)] = (row["name"], row["best"])
    assert len(cells) == 24
    for (n, k, m), times in cells.items():
        chosen = h200_dispatch(m, n, k)
        (before,) = [c for c, (name, _) in times.items() if name == "heuristic"]
        ratio = times[chosen][1] / times[before][1]
        assert 0.7 < ratio < 0.95, (n, k, m, ratio)
        assert times[chosen][1] <= 1.05 * min(us for _, us in times.values()), (n, k, m)


def test_heuristic_split_wave_to_128_rows_against_the_committed_h200_runs(without_two_block_split_wave, without_two_cta_split_wave):
    """From SMALL_M to 128 rows, the H200 races committed under results/ (3 rounds, every config
    checked against the FP32 reference): 'fit', the four untuned shapes at M = 64-128, which set the
    rule; 'check', nine other shapes at M = 64-128, which came after; and 'whole_64_row_blocks', five
    shapes at M = 104-128 where the one-wave rule of whole 64-row blocks came first until then (plus
    a control shape). Every config passed. In 60 of the 61 cells that timed the dispatch's config it
    came within 4 % of the fastest (3072x4096 M = 128: 1.09x). Against the config before, in the 53
    cells where it changed: faster in 49, a tie on 8192x4096 M = 128, 1-2 % slower in two
    (5120x17408, whose table takes stream-K) and 9 % in that one. Untuned run i, after the rule
    reached 128 rows (all 32 M, Marlin and cuBLAS in the same run), was faster than run w (before the
    rule) in all 46 cells whose config the rule changed, M = 17-128."""
    cells = race_cells("h200_ab_2026-12-02i_one_wave_m64-128.json", "h200_ab_2026-12-02i_split_wave_before_whole_64_row_blocks.json")
    assert len(cells) == 16 + 36 + 15

    near_fastest, timed, faster, slower = 0, 0, 0, {}
    for (_, n, k, m), times in cells.items():
        config = h200_dispatch(m, n, k)
        timed_configs = {c: us for c, us in times.values()}
        if config not in timed_configs:
            continue  # six cells whose stream-K form or split was raced in another form
        timed += 1
        near_fastest += timed_configs[config] <= 1.04 * min(timed_configs.values())
        (was, was_us) = [times[name] for name in ("heuristic", "old", "dispatch") if name in times][0]
        if config != was:
            ratio = timed_configs[config] / was_us
            faster += ratio < 1
            if ratio >= 1:
                slower[(n, k, m)] = ratio
    assert (timed, near_fastest, faster) == (61, 60, 49)
    assert slower.keys() == {(5120, 17408, 80), (5120, 17408, 96), (3072, 4096, 128), (8192, 4096, 128)} and max(slower.values()) < 1.1

    # The untuned run: cells up to 128 rows whose config the rule changed, but for 6144x4096 M = 104
    # and 128, which ran the whole 64-row blocks (they came first until the last race above, run
    # after run i). The rule reached past 128 rows after run i (the next test).
    untuned_after = untuned_run("h200_untuned_2026-12-02i.json")
    after = {key: h200_dispatch(m, n, k) for key in untuned_after for n, k, m in [key]}
    with dispatch_without(wg, "split_wave_config"):
        before = {key: h200_dispatch(m, n, k) for key in untuned_after for n, k, m in [key]}
    untuned_before = untuned_run("h200_untuned_2026-12-01w.json")
    changed = [key for key in untuned_after if key[2] <= 128 and after[key] != before[key] and wg.one_wave_config(key[2], *key[:2]) is None]
    slower_untuned = [key for key in changed if untuned_after[key] >= untuned_before[key]]
    assert len(changed) == 46, len(changed)
    assert not slower_untuned, slower_untuned


def test_heuristic_split_wave_to_176_rows_against_the_committed_h200_race(whole_waves_in_16_row_steps, without_two_block_split_wave):
    """Past 128 rows, the H200 race committed under results/ (3 rounds, every config checked against
    the FP32 reference): 'fit', the four untuned shapes at M = 144, 192 and 256 (the dispatch's
    config before, and one x block split or as stream-K, 128- and 64-deep); 'reach', the same shapes
    at M = 152-176; 'check', eight other shapes at M = 136-176. Every config passed. In the 52 cells
    where the dispatch now runs the rule, its config was timed and was faster than the one before in
    46, slower on 8192x4096 M = 144 (1.02x) and on 3072x4096 at M = 136, 144 and 160-176 (1.04-1.13x,
    as at M = 128). The dispatch keeps its config before past 176 rows, which was the fastest raced at
    M = 192 and 256, and past 144 rows where whole x blocks fill one wave (``one_wave_config``). Untuned
    run j (all 32 M, verified) ran the four untuned cells the rule changes, M = 144, in under 0.95x
    their time in run i."""
    cells = race_cells("h200_ab_2026-12-02j_one_wave_m129-256.json")
    assert len(cells) == 12 + 15 + 42
    faster, slower = 0, {}
    for (race, n, k, m), times in cells.items():
        config = h200_dispatch(m, n, k)
        timed = {c: us for c, us in times.values()}
        was, was_us = times["dispatch"]
        if m > wg.SPLIT_WAVE_MAX_M or (m > wg.SPLIT_WAVE_FIRST_MAX_M and wg.one_wave_config(m, n, k) is not None):
            assert config == was, (n, k, m)
            if m >= 192:
                assert was_us == min(timed.values()), (n, k, m)
            continue
        assert config != was and config in timed, (n, k, m)
        ratio = timed[config] / was_us
        faster += ratio < 1
        if ratio >= 1:
            slower[(n, k, m)] = ratio
    assert faster == 46 and max(slower.values()) < 1.13
    assert slower.keys() == {(8192, 4096, 144)} | {(3072, 4096, m) for m in (136, 144, 160, 168, 176)}
    before, after = untuned_run("h200_untuned_2026-12-02i.json"), untuned_run("h200_untuned_2026-12-02j.json")
    changed = [key for key in after if 128 < key[2] <= wg.SPLIT_WAVE_MAX_M and wg.split_wave_config(key[2], *key[:2]) is not None]
    assert len(changed) == 4 and all(after[key] < 0.95 * before[key] for key in changed)


def test_heuristic_split_wave_two_blocks_against_the_committed_h200_race(without_narrow_split_wave, before_the_large_m_rules):
    """The H200 race committed under results/ (3 rounds, every config checked against the FP32
    reference) holds, per cell, the dispatch's config as committed before the split wave reached 352
    rows and its whole-wave blocks came in 8-row steps ('dispatch'), and the configs of the rule as
    planned: 'fit', twelve shapes at M = 152-1024, from which the two-block limits were read; and
    'held_out', twelve other shapes. The dispatch's config was timed in every cell; in the fit it was
    never slower than the one before, and faster in all 76 cells it changed; held out, slower only
    on 6144x6144 M = 360 (1.006x), faster in the other 50 it changed. Untuned run k (all 32 M,
    verified) ran each cell it changed faster than run j."""
    cells = race_cells("h200_ab_2026-12-02k_split_wave_two_blocks.json")
    assert len(cells) == 84 + 73  # four held-out cells were raced twice (the later race counts)
    changed, slower = {"fit": 0, "held_out": 0}, {}
    for (race, n, k, m), times in cells.items():
        config = h200_dispatch(m, n, k)
        timed = {c: us for c, us in times.values()}
        was, was_us = times["dispatch"]
        assert config in timed, (race, n, k, m)
        changed[race] += config != was
        if timed[config] > was_us:
            slower[(n, k, m)] = timed[config] / was_us
    assert changed == {"fit": 76, "held_out": 51}
    assert slower.keys() == {(6144, 6144, 360)} and max(slower.values()) < 1.01
    before, after = untuned_run("h200_untuned_2026-12-02j.json"), untuned_run("h200_untuned_2026-12-02k.json")
    moved = [key for key in after if (race := ("fit", *key)) in cells and cells[race]["dispatch"][0] != h200_dispatch(key[2], *key[:2])]
    assert len(moved) == 19 and all(after[key] < 0.99 * before[key] for key in moved)


def test_split_wave_two_blocks_leave_small_n_to_streamk_against_the_committed_h200_race():
    """The second H200 race of 2026-12-02k (every config checked against the FP32 reference) timed
    the split wave's two blocks on small-N shapes (8-24 tiles of two blocks at M = 192-352) against
    stream-K over 64-row blocks: where each split keeps under SPLIT_WAVE_TWO_BLOCKS_MIN_SPLIT_K of K
    (1024: 1536x4096, 1024x4096, 1024x8192), two blocks lost to it in all 12 cells of the first two
    (1536x4096 M = 304 16.88 us against 14.40) and traded on 1024x8192 (0.97-1.09x the time), and the
    rule now leaves them to the dispatch's stream-K. (1536x8960, 1792 k per split, won 0.89-0.98x in
    the first race.)"""
    cells = race_cells("h200_ab_2026-12-02k_two_blocks_small_n_and_many_tiles.json")
    lost = 0
    for (race, n, k, m), times in cells.items():
        if race != "small_n" or (n, k) == (2048, 2048):  # 2048x2048: 16 k tiles in all, no split of two blocks
            continue
        timed = dict(times.values())
        two = min(us for c, us in timed.items() if isinstance(c, wg.WgmmaConfig) and c.block_x > 64 and c.split_k > 1)
        lost += two > timed[sk.WgmmaStreamKConfig(64, 128, 4, 1, True, 2, True)]
        assert wg.split_wave_config(m, n, k) is None, (n, k, m)
    assert lost == 6 + 6 + 2


def test_narrow_split_wave_against_the_committed_h200_race():
    """The H200 races of 2026-12-02l (every config checked against the FP32 reference) against the
    dispatch before the narrow split wave ('dispatch'): the dispatch's config was timed in every cell
    it changes, except where the candidates took 64-row blocks or the first race's other shapes of
    config; it was the fastest config raced in all 17 of the candidates race and ran faster than the
    dispatch before in all 36 held-out cells (0.30-0.91x); of the 36 cells at a quarter to half fill
    it changes, slower only in three at M <= 64 where it halves a 1024-k split of the same block
    (1.03-1.05x)."""
    timed_changed, untimed, slower = collections.Counter(), collections.Counter(), {}
    for race, n, k, m, config, was_us, timed in changed_race_cells("h200_ab_2026-12-02l_narrow_split_wave.json"):
        if config not in timed:
            untimed[race] += 1
            continue
        timed_changed[race] += 1
        us = timed[config]
        if race == "small_n_candidates":
            assert us == min(timed.values()), (n, k, m)
        if us > was_us:
            slower[(n, k, m)] = us / was_us
    assert timed_changed == {"small_n_candidates": 17, "held_out": 36, "half_fill": 36}
    assert untimed == {"small_n_first": 17, "small_n_candidates": 5}
    assert slower.keys() == {(1024, 8192, 32), (1024, 8192, 64), (2048, 4096, 17)} and max(slower.values()) < 1.06


def test_narrow_split_wave_over_the_same_block_against_the_committed_h200_race():
    """The H200 race of 2026-12-02m over 15 cells at M <= 64 where the narrow split wave keeps the x
    block of the dispatch without it and doubles its 1024-k split (32-64 CTAs): it stays the dispatch
    there, faster in ten (0.85-0.98x) and slower in five, by 1.07x at most, three of them at split 16
    (512x8192 M = 32, 1024x8192 M = 17 and 48) and two at 8 and 12 where the same split won at
    another M or N (1536x4096 M = 17 against M = 48; 768x6144 against 1024x6144)."""
    slower, changed = {}, 0
    for race, n, k, m, config, was_us, timed in changed_race_cells("h200_ab_2026-12-02m_narrow_split_wave_same_block.json"):
        assert config == wg.narrow_split_wave_config(m, n, k) and config in timed, (n, k, m)
        changed += 1
        if timed[config] > was_us:
            slower[(n, k, m)] = (config.split_k, timed[config] / was_us)
    assert changed == 15
    assert {key: split for key, (split, _) in slower.items()} == {
        (512, 8192, 32): 16, (1024, 8192, 17): 16, (1024, 8192, 48): 16, (1536, 4096, 17): 8, (768, 6144, 32): 12}
    assert max(ratio for _, ratio in slower.values()) < 1.07


def test_heuristic_two_block_streamk():
    """At M = 257-352, where two x blocks give more tiles than SMs and K is whole 128-deep tiles:
    stream-K over two x blocks in 8-row steps, 128 deep, two consumer warpgroups and a producer,
    unless the two-wave rule takes the cell (11008x4096 from M = 297). Not at 256 rows or past 352,
    not where two blocks' tiles fit the SMs (6144x4096: the split wave), not with K in 64-deep tiles."""
    for n, k in ((11008, 4096), (14336, 4096), (28672, 8192), (18944, 3584), (8960, 1536)):
        for m in range(sk.TWO_BLOCK_STREAMK_MIN_M, wg.SPLIT_WAVE_MAX_M + 1):
            config = h200_dispatch(m, n, k)
            two_waves = wg.two_waves_config(m, n, k)
            block_x = 8 * -(-m // 16)
            assert config == (two_waves or sk.WgmmaStreamKConfig(block_x, wg.DEEP_K, wg.DEFAULT_STAGES, 1, True, 2, True)), (m, n, k)
            assert 2 * block_x >= m > 2 * (block_x - 8) and block_x <= wg.SPLIT_WAVE_MAX_BLOCK_X
    assert h200_dispatch(272, 11008, 4096) == sk.WgmmaStreamKConfig(136, 128, 4, 1, True, 2, True)
    assert h200_dispatch(304, 11008, 4096) == wg.two_waves_config(304, 11008, 4096)
    for m, n, k in ((256, 14336, 4096), (353, 14336, 4096), (300, 6144, 4096), (300, 14336, 4160)):
        config = h200_dispatch(m, n, k)
        assert not (isinstance(config, sk.WgmmaStreamKConfig) and config.block_k == wg.DEEP_K and config.block_x == 8 * -(-m // 16)), (m, n, k)


def test_two_block_streamk_against_the_committed_h200_race():
    """The H200 races of 2026-12-02l (every config checked against the FP32 reference): in the fit
    (six shapes at M = 272, 304, 352) the dispatch's config was the fastest raced in every cell it
    changes (16), the same blocks 64 deep and the old blocks 128 deep slower; held out (twelve shapes
    at M = 257-345), faster than the dispatch before in 23 of 24 cells, 1.013x on 32768x8192 M = 305."""
    changed, slower = collections.Counter(), {}
    for race, n, k, m, config, was_us, timed in changed_race_cells("h200_ab_2026-12-02l_two_block_streamk.json"):
        assert config in timed, (race, n, k, m)
        changed[race] += 1
        if race == "fit":
            assert timed[config] == min(timed.values()), (n, k, m)
        if timed[config] > was_us:
            slower[(n, k, m)] = timed[config] / was_us
    assert changed == {"fit": 16, "held_out": 24}
    assert slower.keys() == {(32768, 8192, 305)} and max(slower.values()) < 1.02


def test_heuristic_narrow_split_wave(without_two_block_split_wave):
    """Where the split-K config the dispatch would run gives at most FEW_CTAS_MAX_FILL of the SMs a
    CTA (small N), the narrow split wave instead: ceil(M / 64) x blocks in 8-row steps, two consumer
    warpgroups, a producer, TMA, 128-deep k tiles, split as far as one wave holds down to
    NARROW_SPLIT_MIN_K_TILES k tiles per split. Stream-K and the configs that fill more SMs stay."""
    changed = 0
    for n in (128, 256, 512, 768, 1024, 1536, 2048, 3072):
        for k in (1024, 2048, 2304, 4096, 8192):
            for m in range(wg.HEURISTIC_MIN_M, nv.MAX_M_PER_LAUNCH + 1, 8):
                with patched_dispatch(wg, FEW_CTAS_MAX_FILL=0):
                    before = h200_dispatch(m, n, k)
                config = h200_dispatch(m, n, k)
                few = type(before) is wg.WgmmaConfig and wg.wgmma_ctas(before, m, n) <= wg.FEW_CTAS_MAX_FILL * 132
                if not few or wg.narrow_split_wave_config(m, n, k) is None:
                    assert config == before, (m, n, k)
                    continue
                changed += config != before
                x_blocks = -(-m // wg.NARROW_BLOCK_X)
                assert config.block_x % 8 == 0 and config.block_x * x_blocks >= m > (config.block_x - 8) * x_blocks, (m, n, k)
                assert (config.block_k, config.tma_loads, config.warpgroups, config.producer) == (wg.DEEP_K, True, 2, True)
                ctas, k_tiles = wg.wgmma_ctas(config, m, n), k // wg.DEEP_K
                assert ctas <= 132 and k_tiles // config.split_k >= wg.NARROW_SPLIT_MIN_K_TILES, (m, n, k)
                more = ctas // config.split_k * (config.split_k + 1)
                assert config.split_k == nv.MAX_SPLIT_K or more > 132 or k_tiles // (config.split_k + 1) < wg.NARROW_SPLIT_MIN_K_TILES
                wg.check_wgmma_config(config, n, k)
    assert changed > 1000
    # 1024x4096 M = 192 ran one warpgroup's 24 CTAs unsplit (26 us): now three 64-row blocks split 5
    assert h200_dispatch(192, 1024, 4096) == wg.WgmmaConfig(64, 128, 6, 5, True, 2, True)
    # At M = 176 the split wave's 176-row block split 4 (32 CTAs): three 64-row blocks split 5 (120)
    assert h200_dispatch(176, 1024, 4096) == wg.WgmmaConfig(64, 128, 6, 5, True, 2, True)
    # M = 32: the same 32-row block, split 8 (4 k tiles each) where the split wave stops at 4 (1024 k)
    assert h200_dispatch(32, 1024, 4096) == wg.WgmmaConfig(32, 128, 4, 8, True, 2, True)
    # Not where the dispatch runs stream-K, which fills the SMs (2048x8192: 16 tiles of 208 rows)
    assert isinstance(h200_dispatch(385, 2048, 8192), sk.WgmmaStreamKConfig)
    assert wg.narrow_split_wave_config(64, 1024, 4160) is None  # K in 64-deep tiles only


def test_heuristic_two_block_split_wave():
    """Where the dispatch without it runs the one-block split wave (M <= 176) whose splits walk no
    more than SPLIT_WAVE_MIN_SPLIT_K of K and fill more than FEW_CTAS_MAX_FILL of the SMs: two x blocks
    in 8-row steps, split to fill one wave, as split-K (not stream-K), where they give more CTAs, or
    as many unsplit, from TWO_BLOCK_SPLIT_WAVE_MIN_M rows, or as many still split from
    TWO_BLOCK_SPLIT_WAVE_SAME_CTAS_MIN_M. Nothing else changes."""
    changed = collections.Counter()
    for n in (1024, 1536, 2048, 2560, 3072, 3584, 4096, 4608, 5120, 6144, 8192, 9216):
        for k in (1024, 2048, 3072, 4096, 5120, 6144, 8192, 11008):
            for m in range(wg.HEURISTIC_MIN_M, wg.SPLIT_WAVE_MAX_M + 1, 4):
                with dispatch_without(wg, "two_block_split_wave_config"):
                    before = h200_dispatch(m, n, k)
                config = h200_dispatch(m, n, k)
                if config == before:
                    continue
                assert m <= wg.SPLIT_WAVE_MAX_BLOCK_X and before == wg.split_wave_config(m, n, k), (m, n, k)
                assert k // before.split_k <= wg.SPLIT_WAVE_MIN_SPLIT_K, (m, n, k)
                assert type(config) is wg.WgmmaConfig and config.block_x == 8 * -(-m // 16), (m, n, k)
                assert (config.block_k, config.tma_loads, config.warpgroups, config.producer) == (wg.DEEP_K, True, 2, True)
                ctas, ctas_before = wg.wgmma_ctas(config, m, n), wg.wgmma_ctas(before, m, n)
                assert wg.FEW_CTAS_MAX_FILL * 132 < ctas_before and ctas <= 132, (m, n, k)
                if ctas > ctas_before or config.split_k == 1:
                    assert ctas >= ctas_before and m >= wg.TWO_BLOCK_SPLIT_WAVE_MIN_M, (m, n, k)
                    changed["more" if ctas > ctas_before else "as many unsplit"] += 1
                else:
                    assert ctas == ctas_before and m >= wg.TWO_BLOCK_SPLIT_WAVE_SAME_CTAS_MIN_M, (m, n, k)
                    changed["as many split"] += 1
                wg.check_wgmma_config(config, n, k)
    assert changed["more"] > 100 and changed["as many unsplit"] > 20 and changed["as many split"] > 20, changed
    # 3072x4096: 24 tiles split 4 (8 k tiles each) became 48 split 2 from 128 rows
    assert h200_dispatch(144, 3072, 4096) == wg.WgmmaConfig(72, 128, 8, 2, True, 2, True)
    assert h200_dispatch(120, 3072, 4096) == wg.WgmmaConfig(120, 128, 5, 4, True, 2, True)
    # 4608x2048: 36 tiles split 2 became 72 unsplit (as many CTAs, no exchange) from 48 rows
    assert h200_dispatch(128, 4608, 2048) == wg.WgmmaConfig(64, 128, 9, 1, True, 2, True)
    assert h200_dispatch(48, 4608, 2048) == wg.WgmmaConfig(24, 128, 15, 1, True, 2, True)
    assert h200_dispatch(40, 4608, 2048) == wg.WgmmaConfig(40, 128, 8, 2, True, 2, True)
    # More CTAs from 48 rows (2560x4096: 80 become 120), not under it
    assert h200_dispatch(48, 2560, 4096) == wg.WgmmaConfig(24, 128, 10, 3, True, 2, True)
    assert h200_dispatch(40, 2560, 4096) == wg.WgmmaConfig(40, 128, 8, 4, True, 2, True)
    # Not past the split floor (5120x4096: split 3 of 1365 k), not with fewer CTAs (3072x5120: 120
    # become 96), not in the narrow split wave's cells (1536x4096: 48 CTAs)
    assert h200_dispatch(96, 5120, 4096) == wg.WgmmaConfig(96, 128, 6, 3, True, 2, True)
    assert h200_dispatch(96, 3072, 5120) == wg.WgmmaConfig(96, 128, 6, 5, True, 2, True)
    assert h200_dispatch(96, 1536, 4096) == wg.narrow_split_wave_config(96, 1536, 4096)


def test_two_block_split_wave_against_the_committed_h200_race():
    """The H200 races of 2026-12-02m (every config checked against the FP32 reference): the dispatch's
    config was timed in every cell it changes and ran faster than 2975622's dispatch in all 52
    (0.77-0.99x), within 4 % of the fastest config raced where the candidates were raced (mid_fill)."""
    changed, ratios = collections.Counter(), []
    for race, n, k, m, config, was_us, timed in changed_race_cells("h200_ab_2026-12-02m_two_block_split_wave.json"):
        assert config in timed, (race, n, k, m)
        changed[race] += 1
        ratios.append(timed[config] / was_us)
        if race == "mid_fill":
            assert timed[config] <= 1.04 * min(timed.values()), (n, k, m)
    assert changed == {"mid_fill": 17, "boundary": 18, "check": 8, "unsplit": 9}
    assert max(ratios) < 0.99 and min(ratios) > 0.75


def test_streamk_keeps_the_8_row_block_against_the_committed_h200_race():
    """At M = 113-120 the one-wave rule's 120-row tiles run as stream-K over 120 rows, not widened to
    NARROW_STREAMK_BLOCK_X: in the H200 race committed under results/ (both configs checked against
    the FP32 reference) the 120-row form was faster in all four cells."""
    cells = {}
    for row in committed_race_rows("h200_ab_2026-12-02i_streamk_keeps_the_8_row_block.json"):
        cells.setdefault((row["n"], row["k"], row["m"]), {})[sk.config_from_json(row)] = row["best"]
    assert len(cells) == 4
    for (n, k, m), times in cells.items():
        chosen = h200_dispatch(m, n, k)
        assert chosen.block_x == 120 and times[chosen] == min(times.values()), (n, k, m)


def test_heuristic_small_m_split_and_stages():
    """Below SMALL_M, where the split-wave rule does not apply (more weight tiles than SMs, K
    not in 128-deep tiles), and as the tight cover under it: the split doubles while the CTAs fit two
    per SM and each split keeps 16 k tiles; x blocks of up to 32 rows take 128-deep k tiles where
    their CTAs fit two per SM, else 8 stages of 64 (the H200 timings at SMALL_M's and DEEP_K's comments)."""
    assert wg.tight_wgmma_config(32, 4096, 4096) == wg.WgmmaConfig(32, 128, 5, 4)  # split 8 would leave 8 k tiles
    assert wg.tight_wgmma_config(32, 16384, 5120) == wg.WgmmaConfig(32, 128, 5, 2)  # 256 CTAs
    assert wg.get_wgmma_config(32, 34816, 5120) == wg.WgmmaConfig(32, 64, 8, 1)  # 272 CTAs: over two per SM
    assert wg.get_wgmma_config(17, 256, 256) == wg.WgmmaConfig(32, 64, 4, 1)  # two 128-deep tiles: too few stages
    assert wg.get_wgmma_config(40, 34816, 5120) == wg.WgmmaConfig(48, 64, 4, 1)  # 272 tiles fill both slots
    for n, k in [(4096, 4096), (5120, 17408), (11008, 4096), (640, 2304), (256, 256), (128, 512), (34816, 5120), (4096, 4160)]:
        for m in range(wg.HEURISTIC_MIN_M, wg.SMALL_M):
            c = wg.tight_wgmma_config(m, n, k)
            tiles = n // wg.CTA_ROWS
            assert c.split_k == 1 or (tiles * c.split_k <= 2 * 132 and k // 64 // c.split_k >= wg.MIN_K_TILES_PER_SPLIT), (m, n, k, c)
            wg.check_wgmma_config(c, n, k)


def test_heuristic_takes_small_n_from_m5_and_uneven_n_from_m1():
    """Where the weight tiles give at most half of the SMs a CTA, the heuristic takes this kernel from
    M = 5 (the M = 8 timings at HEURISTIC_MIN_M); where they load the SMs unevenly, from M = 1 with
    the split doubled until they spread (UNEVEN_SPLIT_MAX_BLOCK_X); shapes whose tiles spread evenly
    keep the fragment kernel to M = 16, and small-N shapes keep it at M <= 4."""
    assert wg.get_wgmma_config(8, 4096, 4096) == wg.WgmmaConfig(16, 128, 5, 4)
    assert wg.get_wgmma_config(16, 6144, 4096) == wg.WgmmaConfig(16, 128, 5, 4)
    assert wg.get_wgmma_config(4, 4096, 4096) is None
    assert wg.get_wgmma_config(16, 16384, 5120) is None and wg.get_wgmma_config(17, 16384, 5120) is not None  # 128 tiles
    assert wg.get_wgmma_config(16, 14336, 5120) is None  # 112 tiles: the busiest SM holds 1.18x the mean
    assert wg.get_wgmma_config(1, 11008, 4096) == wg.WgmmaConfig(16, 64, 8, 4)  # 86 tiles: 344 CTAs
    assert wg.get_wgmma_config(1, 34816, 5120) == wg.WgmmaConfig(16, 64, 8, 4)  # 272 tiles: 1088 CTAs
    assert wg.get_wgmma_config(8, 5120, 17408) == wg.WgmmaConfig(16, 64, 8, wg.UNEVEN_MAX_SPLIT)  # 40 tiles: 320 CTAs
    assert wg.heuristic_min_m(4096, 132) == wg.SMALL_N_MIN_M and wg.heuristic_min_m(4096, 36) == wg.HEURISTIC_MIN_M  # 32 tiles, 36 SMs
    assert wg.heuristic_min_m(4096, 48) == 1 and wg.heuristic_min_m(11008, 132) == 1  # 32 tiles for 48 SMs, 86 for 132
    assert wg.heuristic_min_m(16384, 132) == wg.HEURISTIC_MIN_M


def committed_timings(name: str) -> dict:
    """``{(n, k, m): {config: us}}`` from a tuner ``--timings`` file committed under results/."""
    import json

    cells = {}
    for row in json.loads((RESULTS / name).read_text())["timings"]:
        cells.setdefault((row["n"], row["k"], row["m"]), {})[sk.config_from_json(row)] = row["us"]
    return cells


def even_two_warpgroup_tiles_decide(m: int, n: int, k: int) -> bool:
    """Whether M is beyond 256 rows, one warpgroup would take full 128-row blocks, and two warpgroups
    take it only because their tiles spread evenly over the SMs (``wg.takes_two_warpgroups``)."""
    one = wg.tight_wgmma_config(m, n, k)
    return m > wg.HEURISTIC_MAX_BLOCK_X and one.block_x >= wg.TMA_BLOCK_X and not wg.two_warpgroup_tiles_load_sms_unevenly(m, n, k, 132)


def test_two_warpgroups_on_even_tiles_against_the_committed_h200_timings():
    """Beyond 256 rows two warpgroups where their tiles spread evenly over the SMs: in every such cell
    of the committed timings (15, on seven shapes, each config verified) the heuristic's config was
    timed and ran faster than one warpgroup's 128-row blocks, the choice before (0.74-0.96x)."""
    old = wg.WgmmaConfig(128, 64, 4, 1, True, 1, False)
    decided = []
    for (n, k, m), times in committed_timings("h200_timings_2026-11-30s_two_warpgroups_m256-1024.json").items():
        if even_two_warpgroup_tiles_decide(m, n, k):
            chosen = h200_dispatch(m, n, k)
            assert chosen == wg._two_warpgroup_config(m, n, k, 132), (n, k, m)  # split-K, not its stream-K twin
            assert times[chosen] < 0.97 * times[old], (n, k, m)
            decided.append((n, k))
    assert len(decided) == 15 and len(set(decided)) == 7


def narrow_streamk_decides(m: int, n: int, k: int) -> bool:
    """Whether the dispatch runs 128-row stream-K in place of two warpgroups' wider x block
    (``sk.NARROW_STREAMK_BLOCK_X``)."""
    c = sk.heuristic_config.__wrapped__(m, n, k, arch="sm_90", sm_count=132)
    wide = wg.get_wgmma_config(m, n, k)
    return isinstance(c, sk.WgmmaStreamKConfig) and c.block_x == sk.NARROW_STREAMK_BLOCK_X < wide.block_x and wide.warpgroups == 2


def test_narrow_streamk_against_the_committed_h200_timings(without_one_wave, whole_waves_in_16_row_steps):
    """At M = 225-256, where two warpgroups' wider x block would run as stream-K over fewer tiles than
    SMs, stream-K over 128-row blocks: in every such cell of the committed timings where the config
    it replaces was timed too (six, on five shapes, each verified), 0.91x its time on geometric mean,
    one cell 2.4 % slower; none with more tiles than SMs (34816x5120 lost there)."""
    import math

    ratios = []
    for name in ("h200_timings_2026-11-30s_two_warpgroups_m256-1024.json", "h200_timings_2026-11-30s_retune_m232-768.json"):
        for (n, k, m), times in committed_timings(name).items():
            if narrow_streamk_decides(m, n, k):
                wide = wg.get_wgmma_config(m, n, k)
                replaced = sk.WgmmaStreamKConfig(wide.block_x, wide.block_k, 4, 1, True, 2, True)
                chosen = h200_dispatch(m, n, k)
                assert chosen == sk.WgmmaStreamKConfig(128, 128, 4, 1, True, 2, True) and chosen in times, (n, k, m)
                if replaced in times:
                    ratios.append(times[chosen] / times[replaced])
            elif (n, k) == (34816, 5120):
                assert not narrow_streamk_decides(m, n, k)
    assert len(ratios) == 6 and sum(r > 1 for r in ratios) == 1
    assert math.exp(sum(map(math.log, ratios)) / len(ratios)) < 0.93


def test_heuristic_against_the_committed_h200_timings(monkeypatch, without_one_wave, without_split_wave, without_two_block_streamk):
    """The two-warpgroup rule was read off the tuner's timings at M = 144-1024 (committed under
    results/): the heuristic's choice, less the producer warpgroup and the two-warpgroup stream-K
    those timings predate (the next tests), was timed in every cell, and on geometric mean it stays
    within 2 % of each cell's fastest candidate (1.016x when fitted; one warpgroup alone was 1.076x).
    Left out: the 20 cells beyond 256 rows where two warpgroups' tiles spread evenly, which the
    producer warpgroup turned around, and the 4 at M = 232 and 256 that the narrow stream-K takes
    (the next tests)."""
    import math

    monkeypatch.setattr(sk, "STREAMK_TWO_WARPGROUPS_MIN_M", nv.MAX_M_PER_LAUNCH + 1)
    ratios = []
    for (n, k, m), times in committed_timings("h200_timings_2026-11-30e_m144-1024.json").items():
        if even_two_warpgroup_tiles_decide(m, n, k) or narrow_streamk_decides(m, n, k):
            continue
        chosen = sk.heuristic_config.__wrapped__(m, n, k, arch="sm_90", sm_count=132)._replace(producer=False)
        assert chosen in times, (n, k, m, chosen)
        ratios.append(times[chosen] / min(times.values()))
    assert len(ratios) == 51 and math.exp(sum(map(math.log, ratios)) / len(ratios)) < 1.02


def test_two_warpgroup_producer_against_the_committed_h200_timings():
    """Two consumer warpgroups take a producer warpgroup (wg.TWO_WARPGROUP_PRODUCER): the H200 twins
    committed under results/ time each table config at M = 144-832 with and without one, and with two
    consumer warpgroups the producer was faster in every cell (0.90x on geometric mean); with one it lost."""
    import math

    ratios = {1: [], 2: []}
    for (n, k, m), times in committed_timings("h200_timings_2026-11-30i_producer_twins.json").items():
        for c, us in times.items():
            if not c.producer and c._replace(producer=True) in times:
                ratios[c.warpgroups].append(times[c._replace(producer=True)] / us)
    assert len(ratios[2]) == 43 and max(ratios[2]) < 1 and math.exp(sum(map(math.log, ratios[2])) / 43) < 0.92
    assert len(ratios[1]) == 2 and min(ratios[1]) > 1
    assert wg.TWO_WARPGROUP_PRODUCER and wg.get_wgmma_config(256, 16384, 5120).producer


def test_heuristic_deep_k_against_the_committed_h200_timings():
    """Where the heuristic takes 128-deep k tiles, the tuner timed both its config and the 64-deep
    twin with 8 stages (M = 24 and 32, committed under results/), and the 128-deep one won every cell.
    The split-wave rule came later and takes most of these cells; the rule under it, which
    these timings decided, is ``wg.tight_wgmma_config``."""
    deep = 0
    for (n, k, m), times in committed_timings("h200_timings_2026-11-30f_m24-64.json").items():
        chosen = wg.tight_wgmma_config(m, n, k)
        streamk = isinstance(h200_dispatch(m, n, k), sk.WgmmaStreamKConfig)
        if wg.HEURISTIC_MIN_M <= m < wg.SMALL_M and chosen.block_k == wg.DEEP_K and not streamk:  # stream-K's: the next test
            deep += 1
            assert times[chosen] < times[chosen._replace(block_k=wg.SWIZZLE_K, stages=wg.DEEP_STAGES)], (n, k, m)
    assert deep == 8  # four shapes at M = 24 and 32; the dispatch runs 34816x5120 as stream-K there


def test_heuristic_uneven_split_against_the_committed_h200_timings(monkeypatch, without_skinny):
    """At M <= 16 the heuristic doubles the split of 16-row x blocks past two CTAs per SM while the
    CTAs load the SMs unevenly (wg.UNEVEN_SPLIT_MAX_BLOCK_X). In every cell where that decides, the
    H200 timings committed under results/ hold its config, the config without the doubling, and
    where the shape would otherwise go to the fragment kernel (N / 128 >= half the SMs) that kernel's
    heuristic config (which evens its own split up to M = 8). The heuristic's config beat the first
    and came within 3 % of the second (34816x5120 M = 1: 36.9 us against 36.0; M = 8: 39.7 against 40.8)."""
    cells = {}
    for name in ("h200_timings_2026-11-30g_m1-16.json", "h200_timings_2026-11-30g_uneven_m1-16.json"):
        cells.update(committed_timings(name))
    decided = 0
    for (n, k, m), times in cells.items():
        chosen = h200_dispatch(m, n, k)
        if not isinstance(chosen, wg.WgmmaConfig) or (n // wg.CTA_ROWS) * chosen.split_k <= wg.SMALL_M_CTAS_PER_SM * 132:
            continue
        decided += 1
        with monkeypatch.context() as patch:
            patch.setattr(wg, "UNEVEN_MAX_SPLIT", 1)
            undoubled = wg._small_m_config(n, k, chosen.block_x, 132)
        assert times[chosen] < times[undoubled], (n, k, m, chosen, undoubled)
        if 2 * (n // wg.CTA_ROWS) > 132:
            fragment = nv.get_config(m, n, k, sm_count=132)
            assert times[chosen] <= 1.03 * times[fragment], (n, k, m, chosen, fragment)
    assert decided == 9  # 34816x5120 at M = 1, 4, 8, 16; 11008x4096 at 1, 8, 16; 5120x17408 at 8, 16


def test_heuristic_evened_split_against_the_committed_h200_timings(without_skinny):
    """Where a doubled split of 4 loads the SMs unevenly and 3 does not (5120x6144: 160 CTAs against
    120), the heuristic takes 3 (wg._evened_split); the H200 tuner timings committed under results/
    hold both configs in every such cell below SMALL_M, and split 3 won each. From M = 17 the small-M
    one-wave rule, which came later, takes 5120x6144; the rule under it is ``wg.tight_wgmma_config``."""
    cells = committed_timings("h200_timings_2026-11-30g_m1-16.json") | committed_timings("h200_timings_2026-11-30f_m24-64.json")
    decided = []
    for (n, k, m), times in cells.items():
        chosen = h200_dispatch(m, n, k)
        if wg.split_wave_config(m, n, k) is not None:
            chosen = wg.tight_wgmma_config(m, n, k)
        if isinstance(chosen, wg.WgmmaConfig) and chosen.split_k % 3 == 0:
            decided.append(m)
            assert times[chosen] < times[chosen._replace(split_k=chosen.split_k // 3 * 4)], (n, k, m, chosen)
    assert sorted(decided) == [8, 16, 24, 32, 48]  # 5120x6144; M <= 4 takes the fragment kernel, M = 64 stream-K


def test_heuristic_streamk_against_the_committed_h200_timings():
    """Two H200 timing files committed under results/ back the stream-K rules of ``heuristic_config``:
    - the 2026-11-30h twins time 64- and 128-deep stream-K (4 stages, two CTAs per SM) beside the
      dispatch's config: 128-deep was faster in every cell that holds both;
    - below M = 64, where the split-K config was timed (the twins on shapes without table entries,
      and the 2026-11-30f tuner timings at M = 24-48, which hold 64-deep stream-K), the heuristic's
      choice between split-K and stream-K was never more than 3 % slower than the other (in the cells
      it still decides: the split-wave rule takes those with no more weight tiles than SMs)."""
    twins = committed_timings("h200_timings_2026-11-30h_streamk_twins.json")
    pairs = 0
    for (n, k, m), times in twins.items():
        for c in times:
            if isinstance(c, sk.WgmmaStreamKConfig) and c.block_k == 64 and c.ctas_per_sm == 2 and c._replace(block_k=128) in times:
                pairs += 1
                assert times[c._replace(block_k=128)] < times[c], (n, k, m, c)
    assert pairs == 42
    taken = []
    for cells, block_k in ((twins, 128), (committed_timings("h200_timings_2026-11-30f_m24-64.json"), 64)):
        for (n, k, m), times in cells.items():
            split_k = wg.get_wgmma_config(m, n, k)
            streamk = sk.WgmmaStreamKConfig(split_k.block_x, block_k, 4, 2) if split_k else None
            if not (wg.HEURISTIC_MIN_M <= m < wg.SMALL_M and split_k in times and streamk in times):
                continue  # (where the split-wave rule applies, split_k is its config: never timed here)
            takes_streamk = isinstance(h200_dispatch(m, n, k), sk.WgmmaStreamKConfig)
            taken += [(n, m)] if takes_streamk else []
            chosen, other = (streamk, split_k) if takes_streamk else (split_k, streamk)
            assert times[chosen] <= 1.03 * times[other], (n, k, m, chosen, other)
    # 5120x17408 at M = 24, 32, 48 and 11008x4096 at 32, 48, 56 took it too until the split-wave rule
    assert sorted(taken) == [(34816, 24), (34816, 32), (34816, 48)]


def test_heuristic_leaves_short_k_to_the_other_kernels():
    """K of fewer than DEFAULT_STAGES k tiles: no wgmma config, and the dispatch's fallback fits."""
    for m in (17, 64, 300):
        assert wg.get_wgmma_config(m, 256, 128) is None
        sk.check_any_config(h200_dispatch(m, 256, 128), 256, 128, "sm_90")


# Each GPU case runs with both loaders (cp.async and TMA: WgmmaConfig.tma_loads).
SPECIAL_SCALE_CONFIGS = [
    wg.WgmmaConfig(bx, 64, 3, split_k=s, tma_loads=t, warpgroups=wgs) for bx, wgs in ((64, 1), (64, 2), (192, 2)) for s in (1, 2) for t in (False, True)
]
GRAPH_CONFIGS = [
    wg.WgmmaConfig(bx, 64, 3, split_k=s, tma_loads=t, warpgroups=wgs) for bx, wgs in ((96, 1), (208, 2)) for s in (1, 4) for t in (False, True)
] + [wg.WgmmaConfig(32, 128, 5, split_k=3, tma_loads=True, warpgroups=2, producer=True, tickets=t) for t in (False, True)]  # marked, and tickets
REFERENCE_CASES = [
    (1, 4096, 4096, wg.WgmmaConfig(16, 64, 4)),
    (16, 5120, 6144, wg.WgmmaConfig(16, 64, 4)),
    (64, 4096, 4096, wg.WgmmaConfig(64, 64, 3)),
    (200, 5120, 6144, wg.WgmmaConfig(128, 64, 3)),
    (1024, 4096, 4096, wg.WgmmaConfig(128, 64, 3)),
    (1100, 640, 2304, wg.WgmmaConfig(64, 64, 4)),
    (1, 4096, 4096, wg.WgmmaConfig(16, 64, 3, split_k=8)),
    (64, 5120, 6144, wg.WgmmaConfig(64, 64, 3, split_k=4)),
    (300, 640, 2304, wg.WgmmaConfig(128, 64, 4, split_k=2)),
    (70, 640, 2304, wg.WgmmaConfig(80, 64, 4, split_k=4)),  # 9 k tiles per split: the odd first tile
    (33, 640, 2304, wg.WgmmaConfig(48, 64, 6)),
    (1, 5120, 6144, wg.WgmmaConfig(8, 64, 8, split_k=2)),  # 8-row x blocks: wgmma's smallest N
    (8, 4096, 4096, wg.WgmmaConfig(8, 64, 4, split_k=8)),
    (20, 640, 2304, wg.WgmmaConfig(24, 64, 4)),  # an x block of 8 rows times an odd number
    (256, 5120, 6144, wg.WgmmaConfig(128, 64, 4, split_k=3)),  # splits need not be powers of two
    (40, 640, 2304, wg.WgmmaConfig(48, 64, 4, split_k=6)),  # 6 k tiles per split
    (144, 5120, 6144, wg.WgmmaConfig(144, 64, 4, warpgroups=2)),  # two warpgroups, one atom each
    (256, 4096, 4096, wg.WgmmaConfig(256, 64, 5, split_k=2, warpgroups=2)),
    (300, 640, 2304, wg.WgmmaConfig(160, 64, 4, split_k=4, warpgroups=2)),  # two x blocks, the second partial; 9 k tiles per split
    (20, 5120, 6144, wg.WgmmaConfig(32, 64, 8, split_k=4, warpgroups=2)),  # twice the warps at small M
    (1, 640, 2304, wg.WgmmaConfig(16, 64, 4, split_k=3, warpgroups=2)),
    (300, 5120, 6144, wg.WgmmaConfig(304, 64, 4, warpgroups=2)),  # two wgmmas per k16 step (N 256 + 48)
    (600, 640, 2304, wg.WgmmaConfig(320, 64, 4, split_k=3, warpgroups=2)),  # two x blocks of 320, the second partial
    (32, 5120, 6144, wg.WgmmaConfig(32, 128, 5, split_k=2)),  # 128-deep k tiles: two x panels per stage
    (200, 640, 2304, wg.WgmmaConfig(96, 128, 3, split_k=2)),  # 9 k tiles per split: the odd first tile; the most rows one warpgroup takes at 128 deep
    (144, 5120, 6144, wg.WgmmaConfig(144, 128, 3, warpgroups=2)),
    (24, 640, 2304, wg.WgmmaConfig(24, 64, 4, split_k=5)),  # uneven: 8 + 4 x 7 k tiles, each count static
    (40, 640, 2304, wg.WgmmaConfig(48, 128, 3, split_k=4)),  # uneven: 5, 5, 4, 4 k tiles, a run-time count
    (20, 5120, 6144, wg.WgmmaConfig(24, 64, 4, split_k=4, warpgroups=2)),  # two warpgroups on 24 rows: 192 x chunks over 256 threads
    (130, 640, 2304, wg.WgmmaConfig(136, 64, 4, warpgroups=2)),  # ... on 136 rows
    (270, 640, 2304, wg.WgmmaConfig(264, 64, 4, warpgroups=2)),  # ... on 264 rows: two wgmmas per k16 step (N 256 + 8)
    (17, 5120, 6144, wg.WgmmaConfig(24, 64, 4, split_k=3, tickets=True)),  # tickets where the marked exchange fits
    (200, 640, 2304, wg.WgmmaConfig(96, 128, 3, split_k=2, a_batches=2)),  # two batches per k tile; the odd first tile
    (33, 5120, 6144, wg.WgmmaConfig(48, 64, 6, a_batches=2)),  # ... of 64-deep tiles
]
REFERENCE_CASES += [(m, n, k, c._replace(tma_loads=True)) for m, n, k, c in REFERENCE_CASES]
# A producer warpgroup (TMA, two consumer warpgroups): stage reuse over many fills, a single fill per
# stage, two wgmmas per k16 step, 128-deep tiles, a partial second x block, split-K.
PRODUCER_CASES = [
    (144, 5120, 6144, wg.WgmmaConfig(144, 64, 4, 1, True, 2, True)),  # 96 k tiles through 4 stages
    (150, 640, 512, wg.WgmmaConfig(160, 64, 8, 1, True, 2, True)),  # 8 k tiles: one fill per stage
    (300, 5120, 6144, wg.WgmmaConfig(304, 64, 5, 1, True, 2, True)),
    (144, 5120, 6144, wg.WgmmaConfig(144, 128, 3, 1, True, 2, True)),
    (600, 640, 2304, wg.WgmmaConfig(320, 64, 4, 1, True, 2, True)),
    (1000, 5120, 6144, wg.WgmmaConfig(352, 64, 4, 1, True, 2, True)),  # the widest x block (lean producer); a partial last one
    # split-K: the consumers exchange on their named barrier; the producer loads its split's k tiles
    (32, 5120, 6144, wg.WgmmaConfig(32, 128, 5, 3, True, 2, True)),  # 16 k tiles per split
    (70, 640, 2304, wg.WgmmaConfig(80, 64, 4, 4, True, 1, True)),  # one consumer warpgroup, 9 k tiles per split
    (32, 640, 2560, wg.WgmmaConfig(32, 128, 5, 3, True, 2, True)),  # uneven: 7, 7, 6 k tiles, each count static
    (48, 640, 2560, wg.WgmmaConfig(48, 128, 4, 3, True, 2, True)),  # uneven, a run-time count
    # stream-K: the producer walks the consumers' segments; pieces meet on the consumers' named barrier
    (256, 5120, 6144, sk.WgmmaStreamKConfig(256, 64, 4, 1, True, 2, True)),  # 40 tiles over 132 CTAs: every tile cut
    (544, 5120, 6144, sk.WgmmaStreamKConfig(272, 64, 4, 1, True, 2, True)),
    (150, 640, 2304, sk.WgmmaStreamKConfig(160, 64, 4, 1, True, 2, True)),  # 5 tiles x 36 k tiles: segments of 1-2 k tiles
    # one consumer warpgroup, two CTAs per SM
    (200, 5120, 6144, wg.WgmmaConfig(128, 64, 4, 1, True, 1, True)),
    (256, 5120, 6144, sk.WgmmaStreamKConfig(128, 64, 4, 2, True, 1, True)),
    (70, 640, 2304, sk.WgmmaStreamKConfig(80, 64, 4, 2, True, 1, True)),  # 5 tiles x 36 k tiles over 264 CTAs
    # two consumer warpgroups and a producer, two CTAs per SM (96 registers per consumer thread)
    (48, 5120, 6144, sk.WgmmaStreamKConfig(48, 64, 4, 2, True, 2, True)),
    (70, 640, 2304, sk.WgmmaStreamKConfig(64, 64, 4, 2, True, 2, True)),  # the most operands that fit: 64
    (16, 34816, 5120, sk.WgmmaStreamKConfig(16, 64, 8, 2, True, 2, True)),
    # two consumer warpgroups on x blocks in 8-row steps (the tuner's narrow twins)
    (24, 16384, 5120, wg.WgmmaConfig(24, 128, 13, 1, True, 2, True)),
    (37, 5120, 6144, wg.WgmmaConfig(40, 128, 5, 3, True, 2, True)),
    (40, 5120, 17408, sk.WgmmaStreamKConfig(40, 128, 8, 1, True, 2, True)),
    # a_batches: a k tile's wgmmas in two or four batches (the table's 34816x5120 M = 17-64 form)
    (32, 34816, 5120, sk.WgmmaStreamKConfig(32, 128, 6, 2, True, 1, True, 0, 2)),  # 272 tiles x 40 k tiles over 264 CTAs: a tile and a piece each
    (21, 640, 2304, sk.WgmmaStreamKConfig(24, 128, 6, 2, True, 1, True, 0, 2)),  # 5 tiles x 18 k tiles over 90 CTAs: one-tile segments, a partial x block
    (70, 640, 2304, sk.WgmmaStreamKConfig(80, 128, 3, 2, True, 1, True, 0, 4)),  # four batches
    (32, 640, 2560, wg.WgmmaConfig(32, 128, 5, 3, True, 2, True, a_batches=2)),  # split-K, uneven: 7, 7, 6 k tiles
    (21, 640, 2560, wg.WgmmaConfig(24, 128, 6, 2, True, 1, True, a_batches=2)),  # one warpgroup's split-K (the table's 16384x5120 M = 17-32 form)
    # scale_pairs: the producer makes each stage's scale pairs, PAIR_LAG k tiles after its loads
    (32, 34816, 5120, sk.WgmmaStreamKConfig(32, 128, 5, 2, True, 1, True, 0, 2, True)),
    (21, 640, 2304, sk.WgmmaStreamKConfig(24, 128, 5, 2, True, 1, True, 0, 2, True)),  # odd segments of 1-2 k tiles: the lag past a segment's end
    (21, 640, 2560, wg.WgmmaConfig(24, 128, 5, 2, True, 1, True, a_batches=2, scale_pairs=True)),
    (32, 5120, 6144, wg.WgmmaConfig(32, 128, 5, 3, True, 2, True, scale_pairs=True)),  # two consumer warpgroups: half blocks of pairs
    # three CTAs per SM of one consumer warpgroup and the lean producer (four A batches: 64 operand registers)
    (32, 34816, 5120, sk.WgmmaStreamKConfig(32, 128, 4, 3, True, 1, True, 0, 4)),  # 272 tiles x 40 k tiles over 396 CTAs
    (21, 640, 2304, sk.WgmmaStreamKConfig(24, 128, 3, 3, True, 1, True, 0, 4)),  # 5 tiles x 18 k tiles: one-tile segments, a partial x block
    (24, 34816, 5120, sk.WgmmaStreamKConfig(24, 128, 4, 3, True, 1, True, 0, 4, True)),  # with scale pairs (4 stages fit)
    (1024, 5120, 6144, sk.WgmmaStreamKConfig(256, 64, 4, 1, True, 2, True, 1)),  # 160 tiles: 28 cut, one wave
    (16, 34816, 512, sk.WgmmaStreamKConfig(16, 64, 4, 1, True, 2, True, 2)),  # 272 tiles: 140 cut, one wave
    (256, 4224, 1024, sk.WgmmaStreamKConfig(64, 64, 4, 1, True, 2, True, 1)),  # 132 tiles: all whole, none cut
    # tails (tail_k_tiles): the splits share all but each tile's last k tiles, which tail CTAs run, a few tiles' each
    (32, 5120, 17408, wg.WgmmaConfig(32, 128, 8, 3, True, 2, True, tail_k_tiles=10, tails_per_cta=4)),  # 120 + 10 CTAs: 42 k tiles each, tails of 4 x 10
    (21, 640, 2560, wg.WgmmaConfig(24, 128, 5, 2, True, 2, True, scale_pairs=True, tail_k_tiles=3, tails_per_cta=2)),  # the last tail CTA has one; splits of 9 and 8
]
# Stream-K over the wgmma kernel (WgmmaStreamKConfig), checked by the same reference test.
STREAMK_CASES = [
    (256, 5120, 6144, sk.WgmmaStreamKConfig(128, 64, 4, 2)),  # 80 tiles x 96 k tiles over 264 CTAs: every tile cut
    (70, 640, 2304, sk.WgmmaStreamKConfig(80, 64, 4, 2)),  # 5 tiles x 36 k tiles: ranges inside one tile, odd counts
    (1, 4096, 4096, sk.WgmmaStreamKConfig(8, 64, 4, 2)),
    (1024, 4096, 4096, sk.WgmmaStreamKConfig(128, 64, 4, 2)),  # 256 tiles: most CTAs own whole tiles
    (256, 5120, 6144, sk.WgmmaStreamKConfig(256, 64, 4, 1, warpgroups=2)),  # two warpgroups: 40 tiles over 132 CTAs
    (48, 5120, 6144, sk.WgmmaStreamKConfig(48, 64, 4, 2, warpgroups=2)),
    (544, 5120, 6144, sk.WgmmaStreamKConfig(272, 64, 4, 1, warpgroups=2)),  # two wgmmas per k16 step
    (70, 640, 2304, sk.WgmmaStreamKConfig(80, 128, 3, 2)),  # 128-deep k tiles: 5 tiles x 18 k tiles
    (32, 11008, 4096, sk.WgmmaStreamKConfig(32, 128, 4, 2)),  # the heuristic's: 86 tiles x 32 k tiles over 264 CTAs
    (1024, 16384, 1024, sk.WgmmaStreamKConfig(128, 64, 4, 2, streamk_waves=2)),  # 1024 tiles, 264 CTAs: 496 cut (232 and a wave), two waves
    (512, 4224, 1024, sk.WgmmaStreamKConfig(64, 64, 4, 2, streamk_waves=1)),  # 264 tiles over 264 CTAs: all whole
    (24, 34816, 5120, sk.WgmmaStreamKConfig(24, 128, 7, 2)),  # x blocks in 8-row steps (the tuner's narrow twins)
    (37, 5120, 6144, sk.WgmmaStreamKConfig(40, 128, 5, 2)),
    (70, 640, 2304, sk.WgmmaStreamKConfig(80, 128, 3, 2, a_batches=2)),  # a_batches without a producer
    (30, 640, 2304, wg.WgmmaConfig(16, 64, 4, 3, tail_k_tiles=4, tails_per_cta=3)),  # tails without a producer: two x blocks, splits of 11, 11, 10
]
# With TMA loads the stage barriers' phases run on across a CTA's segments (``base``).
STREAMK_CASES += [(m, n, k, c._replace(tma_loads=True)) for m, n, k, c in STREAMK_CASES]


# Every (N, K, config) the GPU tests below compile.
GPU_CASE_CONFIGS = (
    {(n, k, c) for _, n, k, c in REFERENCE_CASES + STREAMK_CASES + PRODUCER_CASES}
    | {(1024, 2048, c) for c in SPECIAL_SCALE_CONFIGS}
    | {(5120, 6144, c) for c in GRAPH_CONFIGS}
)


def test_gpu_cases_are_valid_configs():
    """The GPU cases run only on an H200; a config or a weight shape that cannot launch must fail
    here, on any machine."""
    for n, k, config in GPU_CASE_CONFIGS:
        sk.check_any_config(config, n, k, "sm_90")
        assert n % 128 == 0 and k % 256 == 0, f"prepare_nvfp4_weight refuses N={n}, K={k}"


def test_sanitizer_cases_cover_every_store_and_load_path():
    """The compute-sanitizer script's cases launch, and between them take both loaders, split-K, a
    producer, two warpgroups, a partial x block and stream-K (whose CTAs refill a stage after a store)."""
    sys.path.insert(0, str(ROOT / "maint" / "gemm" / "gemm_sm90"))
    import sanitize_sm90_nvfp4_w4a16_wgmma as sanitize

    configs = [config for _, _, _, config in sanitize.SANITIZER_CASES]
    for _, n, k, config in sanitize.SANITIZER_CASES:
        sk.check_any_config(config, n, k, "sm_90")
    assert any(m % config.block_x for m, _, _, config in sanitize.SANITIZER_CASES)  # a partial x block
    assert {c.tma_loads for c in configs} == {False, True}
    assert any(isinstance(c, wg.WgmmaConfig) and c.split_k > 1 for c in configs)
    assert {c.producer for c in configs} == {False, True}
    assert {c.warpgroups for c in configs} == {1, 2}
    assert any(isinstance(c, sk.WgmmaStreamKConfig) for c in configs)


@pytest.fixture(scope="module", autouse=True)
def precompiled_wgmma_kernels(precompiles):
    """Compile the GPU tests' kernels in parallel first (TileLang's disk cache turns each in-test
    compile into a load). Correctness does not depend on it."""
    if ON_SM90 and precompiles:
        nv.precompile(GPU_CASE_CONFIGS, "sm_90", sk.compile_any)


@needs_sm90
@pytest.mark.parametrize("m, n, k, config", REFERENCE_CASES + STREAMK_CASES)
def test_matches_reference(m, n, k, config):
    result = nv.verify(m, n, k, config=config, seed=m, linear=sk.nvfp4_w4a16_linear)
    assert result["ok"], result


@needs_sm90
@pytest.mark.parametrize("m, n, k, config", PRODUCER_CASES)
def test_producer_matches_reference(m, n, k, config):
    """Apart from the other cases (``-k producer`` runs it alone): a wrong barrier phase hangs, and
    ``pytest --timeout`` is not a dependency. First run on the H200 2026-11-30i: all passed, and
    compute-sanitizer racecheck and synccheck found nothing."""
    result = nv.verify(m, n, k, config=config, seed=m, linear=sk.nvfp4_w4a16_linear)
    assert result["ok"], result
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(n, k, "cuda"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert nv.graph_replays_match_eager(lambda x: sk.nvfp4_w4a16_linear(x, w, config), x)


@needs_sm90
@pytest.mark.parametrize("config", SPECIAL_SCALE_CONFIGS)
def test_zero_negative_subnormal_scales_with_per_column_alpha(config):
    n, k = 1024, 2048
    g = torch.Generator().manual_seed(11)
    packed, scales, _ = nv.random_nvfp4_weight(n, k, generator=g)
    raw = scales.view(torch.uint8).clone()
    special = torch.tensor([0x00, 0x80, 0x01, 0x81, 0x07, 0x87, 0xFE, 0xB8], dtype=torch.uint8)  # 0, -0, subnormals, -448..
    pick = torch.rand(raw.shape, generator=g) < 0.1
    raw[pick] = special[torch.randint(0, len(special), (int(pick.sum()),), generator=g)]
    scales = raw.view(torch.float8_e4m3fn).cuda()
    alpha = ((torch.rand(n, generator=g) + 0.5) * 2.0 ** torch.randint(-8, 3, (n,), generator=g).float()).cuda()
    packed = packed.cuda()
    w = nv.prepare_nvfp4_weight(packed, scales, alpha)
    for m in (1, 64, 300):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        result = nv.compare_with_reference(sk.nvfp4_w4a16_linear(x, w, config), nv.reference_nvfp4_linear(x, packed, scales, alpha))
        assert result["ok"], result


@needs_sm90
@pytest.mark.parametrize("config", GRAPH_CONFIGS)
def test_graph_replays_match_eager(config):
    n, k, m = 5120, 6144, 96
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(n, k, "cuda"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert nv.graph_replays_match_eager(lambda x: sk.nvfp4_w4a16_linear(x, w, config), x)
    if config.split_k > 1:  # marked or not, the split launches leave every marked partial marked
        assert (nv._WORKSPACES[w.device].marked_partials.view(torch.int32) == nv.PARTIAL_MARK - 2**32).all()


def test_deepest_stages_keep_two_ctas_per_sm():
    """The tuner's deep-pipeline candidate: as many stages as two CTAs can hold on one SM, no more,
    barriers included (the producer's, the most)."""
    for bx in range(16, wg.ONE_WARPGROUP_MAX_BLOCK_X + 1, 16):
        stages = wg.deepest_stages(bx)
        config = wg.WgmmaConfig(bx, wg.SWIZZLE_K, stages, tma_loads=True, producer=True)
        wg.check_wgmma_config(config, 16384, 5120)
        assert 2 * wg.cta_smem(config) <= wg.SM90_SMEM_PER_SM < 2 * wg.cta_smem(config._replace(stages=stages + 1))
        assert stages >= wg.DEFAULT_STAGES


def test_cta_smem_counts_what_the_kernel_allocates():
    """``cta_smem`` covers the kernel's dynamic buffer (from the host launch) and its static
    barriers: so three 24-row CTAs of five 128-deep stages, 76800 bytes of stages each, do not fit
    one SM (on the H200 only two did), and stream-K's check refuses them."""
    config = sk.WgmmaStreamKConfig(24, 128, 4, 3, True, 1, True, 0, 4)
    kernel = sk.compile_wgmma_streamk(34816, 5120, config)
    source, host = kernel.get_kernel_source(), kernel.adapter.get_host_source()
    static = sum(8 * int(count) for count in re.findall(r"__shared__ __align__\(\d+\) uint64_t \w+\[(\d+)\];", source))
    assert static == wg.MBARRIER_BYTES * 2 * config.stages  # full and empty
    dynamic = [int(v) for v in re.findall(r"\(\(int64_t\)(\d+)\)", host) if 0 <= int(v) - wg.shared_bytes(config) < wg.CTA_SCALAR_SMEM]
    assert dynamic and wg.shared_bytes(config) + static < dynamic[0] + static <= wg.cta_smem(config) - wg.CTA_RESERVED_SMEM
    five = config._replace(stages=5)
    assert 3 * (wg.shared_bytes(five) + wg.CTA_RESERVED_SMEM) == wg.SM90_SMEM_PER_SM < 3 * wg.cta_smem(five)
    with pytest.raises(ValueError, match="ctas_per_sm"):
        sk.check_any_config(five, 34816, 5120, "sm_90")


# ----------------------------------------------------------------------------------------------
# Stream-K over the wgmma kernel (WgmmaStreamKConfig)
# ----------------------------------------------------------------------------------------------


class ModelBarrier:
    """An mbarrier as PTX defines it: a phase completes when its pending arrivals and its pending
    transaction bytes are both zero; ``try_wait.parity(p)`` passes once the phase of parity p has
    completed (on a fresh barrier, the 'previous' phase, parity 1, counts as completed)."""

    def __init__(self, count: int):
        self.count, self.pending, self.tx, self.phases = count, count, 0, 0

    def arrive(self, n: int = 1):
        self.pending -= n
        assert self.pending >= 0, "more arrivals than the barrier counts"
        self._complete()

    def expect_tx(self, nbytes: int):
        self.tx += nbytes

    def complete_tx(self, nbytes: int):
        self.tx -= nbytes
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phases, self.pending = self.phases + 1, self.count

    def passed(self, parity) -> bool:
        return self.phases % 2 != parity


def run_producer_protocol(stages: int, counts: list, seed: int, consumers: int = 2, scale_pairs: bool = False) -> None:
    """The producer warpgroup's protocol (``wgmma_pipeline``) under one random interleaving, over a
    CTA's segments of ``counts`` k tiles each (one for split-K, several for stream-K): the producer's
    elected thread (expect_tx, TMA, arrive) and its other 127 threads, the TMA engine finishing copies
    in any order, and ``consumers`` consumer warpgroups (``consume``: tile t > 0 of a segment releases tile
    t - 1 once its wgmma retired, the segment's end releases its last). With ``scale_pairs`` every
    producer thread, ``PAIR_LAG`` loads after a tile's, waits for that tile to land and makes its
    pairs (the stage's second barrier), which the consumers wait for too. It checks that every k tile
    a consumer reads is the one that landed for it, that no TMA write lands in a stage a consumer
    still reads, and that nothing deadlocks. The phase arithmetic is the kernel's
    (``wg.full_parity``, ``wg.empty_parity``), on k tiles counted over the segments (``base + t``)."""
    import random

    rng = random.Random(seed)
    full = [ModelBarrier(wg.WARPGROUP_THREADS) for _ in range(stages)]
    pairs = [ModelBarrier(wg.WARPGROUP_THREADS) for _ in range(stages)]
    empty = [ModelBarrier(consumers * wg.WARPGROUP_THREADS) for _ in range(stages)]
    data, readers, copies = [None] * stages, [set() for _ in range(stages)], []
    lag = wg.PAIR_LAG if scale_pairs else 0

    def producer_thread(load, threads: int):
        """One of the producer's threads (``threads`` of them, as one agent), as ``produce`` runs."""
        base = 0
        for count in counts:
            for t in range(count + lag):
                if t < count:
                    i, s = base + t, (base + t) % stages
                    yield lambda: empty[s].passed(wg.empty_parity(i, stages))
                    load(i, s)
                if scale_pairs and t >= lag:
                    u, s = base + t - lag, (base + t - lag) % stages
                    yield lambda: full[s].passed(wg.full_parity(u, stages))
                    pairs[s].arrive(threads)
            base += count

    def elected_load(i, s):
        assert not readers[s], f"tile {i}'s TMA overwrites stage {s} while {readers[s]} read it"
        full[s].expect_tx(1)
        copies.append((s, i))
        full[s].arrive()

    def release(c, i):
        readers[i % stages].discard(c)
        empty[i % stages].arrive(wg.WARPGROUP_THREADS)

    def consumer(c):
        base = 0
        for count in counts:
            for t in range(count):
                i, s = base + t, (base + t) % stages
                yield lambda: full[s].passed(wg.full_parity(i, stages)) and (not scale_pairs or pairs[s].passed(wg.full_parity(i, stages)))
                assert data[s] == i, f"consumer {c} read tile {data[s]} for tile {i}"
                readers[s].add(c)  # its dequant and wgmma read the stage ...
                if t > 0:  # ... and tile i - 1's wgmma has retired (warpgroup_wait(1))
                    release(c, i - 1)
                yield lambda: True
            release(c, base + count - 1)
            base += count
            yield lambda: True  # the segment's store or fix-up

    elected = producer_thread(elected_load, 1)
    others = producer_thread(lambda i, s: full[s].arrive(wg.WARPGROUP_THREADS - 1), wg.WARPGROUP_THREADS - 1)
    agents = [[elected, None], [others, None]] + [[consumer(c), None] for c in range(consumers)]
    for agent in agents:
        agent[1] = next(agent[0], None)
    while any(agent[1] is not None for agent in agents) or copies:
        ready = [a for a in agents if a[1] is not None and a[1]()]
        if copies and (not ready or rng.random() < 0.3):  # the TMA engine lands a copy, any of them
            s, i = copies.pop(rng.randrange(len(copies)))
            data[s] = i
            full[s].complete_tx(1)
            continue
        assert ready, f"deadlock: stages={stages} counts={counts} seed={seed}"
        agent = rng.choice(ready)
        agent[1] = next(agent[0], None)


@pytest.mark.parametrize("consumers", [1, 2])
@pytest.mark.parametrize("stages", [3, 4, 7])
@pytest.mark.parametrize("counts", [[1], [2], [3], [16], [1, 1, 1], [5, 1, 7], [3, 8, 2, 9]])
def test_producer_protocol_model(stages, counts, consumers):
    for seed in range(40):
        run_producer_protocol(stages, counts, seed, consumers)
        if stages >= wg.SCALE_PAIR_MIN_STAGES:
            run_producer_protocol(stages, counts, seed, consumers, scale_pairs=True)


def test_scale_pairs_deadlock_under_their_fewest_stages():
    """One stage fewer than SCALE_PAIR_MIN_STAGES and the producer waits for a release that waits for
    pairs the producer has not made yet (3 stages hung on the H200); the check refuses it."""
    with pytest.raises(AssertionError, match="deadlock"):
        run_producer_protocol(wg.SCALE_PAIR_MIN_STAGES - 1, [16], 0, 1, scale_pairs=True)
    config = sk.WgmmaStreamKConfig(32, 128, wg.SCALE_PAIR_MIN_STAGES - 1, 2, True, 1, True, 0, 2, True)
    with pytest.raises(ValueError, match="stages"):
        sk.check_any_config(config, 34816, 5120, "sm_90")
    sk.check_any_config(config._replace(stages=wg.SCALE_PAIR_MIN_STAGES), 34816, 5120, "sm_90")


@pytest.mark.parametrize(
    "name, wrong",
    [
        ("empty_parity", lambda i, stages: 1),  # the producer never waits for a release: overwrites
        ("empty_parity", lambda i, stages: i // stages % 2),  # waits for its own fill's release: deadlock
        ("full_parity", lambda i, stages: (i // stages + 1) % 2),  # consumers pass before the data lands
    ],
)
def test_producer_protocol_model_catches_wrong_parities(monkeypatch, name, wrong):
    """The model is not vacuous: each of these mistakes in the phase arithmetic fails it."""
    monkeypatch.setattr(wg, name, wrong)
    with pytest.raises(AssertionError):
        for seed in range(40):
            run_producer_protocol(3, [5, 1, 7], seed)


@pytest.mark.parametrize("n, k, config", [(n, k, c) for _, n, k, c in PRODUCER_CASES[2:4] + PRODUCER_CASES[5:10] + PRODUCER_CASES[-8:]])
def test_producer_gives_its_registers_to_the_consumers(n, k, config):
    """With a producer warpgroup the CTA launches with the registers its share of an SM allows
    (``producer_ctas_per_sm`` CTAs); setmaxnreg moves the producer's to the consumers, and ptxas
    compiles their path within that, unserialized and without spills (the one-warpgroup 128-row
    kernel used 218 registers without a producer, 216 are its consumers' share; two two-warpgroup
    CTAs per SM leave 96, three one-warpgroup CTAs 136). The unsplit and split-K kernel's producer
    keeps the lean share, stream-K's the larger one but at three CTAs per SM."""
    wgs = config.warpgroups
    ctas = wg.producer_ctas_per_sm(wgs, getattr(config, "ctas_per_sm", 1))
    producer = wg.LEAN_PRODUCER_REGISTERS if isinstance(config, wg.WgmmaConfig) else wg.streamk_producer_registers(wgs, ctas)
    source = sk.compile_any(n, k, config, "sm_90").get_kernel_source()
    report = ptxas_report(source)
    assert f"warpgroup_reg_alloc<{wg.consumer_registers(wgs, ctas, producer)}>" in source and f"warpgroup_reg_dealloc<{producer}>" in source
    threads = wg.WARPGROUP_THREADS * (wgs + 1)
    assert f"__launch_bounds__({threads}, {ctas})" in source
    assert "__syncthreads();" not in source.split("warpgroup_reg_alloc")[1]  # split-K and stream-K: named barriers
    assert " 0 bytes spill stores" in report and "C7513" not in report and "serialized" not in report, report


def test_consumer_registers_fit_the_launch_pool():
    """setmaxnreg.inc waits until the CTA's own pool holds what it asks for, so the producer's and
    the consumers' registers must fit what the CTA launched with, or the kernel hangs (two CTAs of
    two consumer warpgroups at 104 did on the H200); and the launch must fit the SM."""
    assert [wg.consumer_registers(2, 1), wg.consumer_registers(1, 2), wg.consumer_registers(2, 2)] == [232, 216, 96]
    lean = wg.LEAN_PRODUCER_REGISTERS
    assert [wg.consumer_registers(2, 1, lean), wg.consumer_registers(1, 2, lean), wg.consumer_registers(1, 3, lean)] == [240, 232, 136]
    assert [wg.streamk_producer_registers(w, c) for w, c in ((2, 1), (2, 2), (1, 1), (1, 2), (1, 3))] == [wg.PRODUCER_REGISTERS] * 4 + [lean]
    for consumers, ctas, producer in ((2, 1, wg.PRODUCER_REGISTERS), (1, 2, wg.PRODUCER_REGISTERS), (2, 2, wg.PRODUCER_REGISTERS), (2, 1, lean), (1, 2, lean), (1, 3, lean)):
        threads = wg.WARPGROUP_THREADS * (consumers + 1)
        pool = wg.launch_registers(consumers, ctas) * threads
        used = wg.WARPGROUP_THREADS * (consumers * wg.consumer_registers(consumers, ctas, producer) + producer)
        assert pool - wg.REGISTER_STEP * wg.WARPGROUP_THREADS * consumers < used <= pool and ctas * pool <= wg.SM_REGISTERS
    assert wg.producer_ctas_per_sm(1, 1) == 2 and wg.producer_ctas_per_sm(2, 1) == 1 and wg.producer_ctas_per_sm(2, 2) == 2


def test_streamk_keeps_wgmma_in_flight_with_run_time_tile_counts():
    """Each stream-K segment has a k-tile count known only at run time (its odd first tile is a
    run-time branch); ptxas must still keep the wgmmas asynchronous."""
    for n, k, config in (
        (5120, 6144, sk.WgmmaStreamKConfig(128, 64, 4, 2)),
        (5120, 6144, sk.WgmmaStreamKConfig(128, 64, 4, 2, True)),
        (11008, 4096, sk.WgmmaStreamKConfig(32, 128, 4, 2)),  # the heuristic's 128-deep stream-K at M = 17-32
        (5120, 6144, sk.WgmmaStreamKConfig(128, 64, 4, 2, True, streamk_waves=1)),  # whole tiles after the pieces
        (5120, 6144, sk.WgmmaStreamKConfig(256, 64, 4, 1, True, 2, True, 2)),
    ):
        report = ptxas_report(sk.compile_wgmma_streamk(n, k, config).get_kernel_source())
        assert "Used" in report and "C7513" not in report and "serialized" not in report, report


@pytest.mark.parametrize(
    "config",
    [
        sk.WgmmaStreamKConfig(32, 128, 8, 1, True, 2, True),  # two warpgroups and a producer
        sk.WgmmaStreamKConfig(32, 128, 6, 2, True, 1, False),  # 34816x5120 and 5120x17408 M = 18-32 in the H200 table
        sk.WgmmaStreamKConfig(32, 128, 4, 2, False, 1, False),  # cp.async
        sk.WgmmaStreamKConfig(16, 64, 8, 2, True, 2, True, 2),
    ],
)
def test_narrow_streamk_runs_whole_tiles_with_a_static_trip_count(config):
    """At x blocks up to TWO_LOOPS_MAX_BLOCK_X a segment that covers its whole tile runs the k loop
    with a static trip count (40 k tiles of 128 at K = 5120, the wgmma loop unrolled by two: 20; 80
    of 64: 40), a piece with its run-time count, and the second loop body neither spills nor
    serializes the wgmmas."""
    assert config.block_x <= sk.hopper.TWO_LOOPS_MAX_BLOCK_X
    source = sk.compile_wgmma_streamk(16384, 5120, config).get_kernel_source()
    assert re.search(rf"for \(int t2\w* = 0; t2\w* < {5120 // config.block_k // 2};", source), "no static whole-tile loop"
    assert re.search(r"for \(int t2\w* = 0; t2\w* < \(count\w* >> 1\);", source), "no run-time piece loop"
    report = ptxas_report(source)
    assert " 0 bytes spill stores" in report and "C7512" not in report and "C7513" not in report, report


@pytest.mark.parametrize("config", [sk.WgmmaStreamKConfig(32, 64, 4, 3, True, 1, False), sk.WgmmaStreamKConfig(48, 64, 4, 3, False, 1, False)])
def test_streamk_without_a_producer_keeps_within_its_ctas_launch_bound(config):
    """Three one-warpgroup CTAs per SM leave 168 registers per thread, under ptxas's own 255: the
    kernel carries them as its launch bound, and ptxas fits the operands the host check let through
    (96 and 112) without spills and with the wgmmas asynchronous."""
    source = sk.compile_wgmma_streamk(34816, 5120, config).get_kernel_source()
    assert "__launch_bounds__(128, 3)" in source
    report = ptxas_report(source)
    assert registers(report) <= wg.bounded_registers(1, 3)
    assert " 0 bytes spill stores" in report and "C7512" not in report and "C7513" not in report, report


def test_wide_streamk_keeps_one_run_time_loop():
    """Wider x blocks keep the one run-time loop: with the static one too, 48 rows at two CTAs per SM
    had ptxas serialize the wgmmas (C7512) and 256 rows with a producer spilled."""
    source = sk.compile_wgmma_streamk(34816, 5120, sk.WgmmaStreamKConfig(48, 128, 5, 2, False, 1, False)).get_kernel_source()
    assert not re.search(r"for \(int t2\w* = 0; t2\w* < 20;", source)
    assert "C7512" not in ptxas_report(source)


@pytest.mark.parametrize(
    "config",
    [
        sk.WgmmaStreamKConfig(block_x=12),
        sk.WgmmaStreamKConfig(stages=2),
        sk.WgmmaStreamKConfig(ctas_per_sm=3),
        sk.WgmmaStreamKConfig(block_k=128),
        sk.WgmmaStreamKConfig(block_x=256, ctas_per_sm=2, warpgroups=2),  # two warpgroups' registers fill an SM
        sk.WgmmaStreamKConfig(block_x=256, ctas_per_sm=1),  # over 128 rows needs two warpgroups
        sk.WgmmaStreamKConfig(80, 64, 4, 2, True, 2, True),  # two such CTAs per SM: 72 operand registers of 96
        sk.WgmmaStreamKConfig(16, 128, 4, 2, True, 2, True),  # ... here too (ptxas serialized the wgmmas)
        sk.WgmmaStreamKConfig(16, 64, 4, 3, True, 2, True),  # three such CTAs
        sk.WgmmaStreamKConfig(64, 64, 4, 3, True, 1, True),  # three CTAs of one consumer warpgroup and a producer: 128 operand registers of 64
        sk.WgmmaStreamKConfig(32, 128, 4, 3, True, 1, True, 0, 2),  # ... two A batches: 96
        sk.WgmmaStreamKConfig(40, 128, 4, 3, True, 1, True, 0, 4),  # ... 40 rows in four batches: 72
        sk.WgmmaStreamKConfig(16, 64, 4, 4, True, 1, True),  # four such CTAs
        sk.WgmmaStreamKConfig(32, 128, 5, 3, True, 1, True, 0, 4),  # three CTAs of five 32-row stages: over an SM's shared memory
        sk.WgmmaStreamKConfig(32, 128, 3, 2, True, 1, True, 0, 2, True),  # scale pairs in 3 stages: producer and consumers deadlock
        sk.WgmmaStreamKConfig(352, 64, 4, 1, True, 2, True),  # over stream-K's x block (its consumers' registers)
        sk.WgmmaStreamKConfig(32, 128, 4, 3, True, 1, False),  # 160 operand registers; three CTAs leave 112
        sk.WgmmaStreamKConfig(16, 64, 4, 4, True, 1, False),  # four CTAs leave 72 of 128, not 80
        sk.WgmmaStreamKConfig(streamk_waves=-1),  # 0 is plain stream-K, no fewer
        sk.WgmmaStreamKConfig(streamk_waves=True),  # an int field
    ],
)
def test_streamk_bad_configs(config):
    with pytest.raises(ValueError):
        sk.check_any_config(config, 4096, 4096, "sm_90")


def test_heuristic_takes_streamk_where_the_ctas_load_the_sms_unevenly(without_one_wave):
    """From M = 64, stream-K over the wgmma kernel where the split-K kernel's busiest SM would hold
    at least 1.2x the mean (5120x6144 M = 512: 160 CTAs on 132 SMs); not where the CTAs spread evenly
    (16384x5120 M = 512: 512 CTAs), not where a CTA would get under 8 k tiles. At M = 17-63 only from
    1.45x the mean and where the weight tiles outnumber the SMs (34816x5120 M = 32: 272 CTAs, 1.46x;
    with fewer tiles the split-wave rule gives a CTA per SM at most: 5120x17408 and 11008x4096),
    and never at M <= 16. From M = 64 it runs two consumer warpgroups and a producer over 128-deep k
    tiles; below, one warpgroup, two CTAs per SM, 128-deep k tiles up to 64 x rows."""
    assert nv.sm_imbalance(80, 132) == pytest.approx(132 / 80) and nv.sm_imbalance(264, 132) == 1.0
    assert h200_dispatch(512, 5120, 6144) == sk.WgmmaStreamKConfig(128, 128, 4, 1, True, 2, True)
    assert isinstance(h200_dispatch(512, 16384, 5120), wg.WgmmaConfig)
    assert h200_dispatch(32, 34816, 5120) == sk.WgmmaStreamKConfig(32, 128, 4, 2)
    assert h200_dispatch(64, 6144, 4096) == sk.WgmmaStreamKConfig(64, 128, 4, 1, True, 2, True)
    for m, n, k in ((32, 5120, 17408), (56, 11008, 4096), (32, 6144, 4096)):  # 1.65x, 1.53x, 1.38x the mean as split-K
        assert h200_dispatch(m, n, k) == wg.split_wave_config(m, n, k)
    for n, k in [(5120, 17408), (11008, 4096), (34816, 5120)]:  # 1.46-1.65x at M = 17-63
        assert all(not isinstance(h200_dispatch(m, n, k), sk.WgmmaStreamKConfig) for m in range(1, 17))
    assert isinstance(h200_dispatch(128, 640, 2304), wg.WgmmaConfig)
    for n, k in [(5120, 6144), (4096, 4096), (640, 2304), (34816, 5120)]:
        for m in range(17, nv.MAX_M_PER_LAUNCH + 1, 37):
            sk.check_any_config(h200_dispatch(m, n, k), n, k, "sm_90")


def test_streamk_runs_on_sm90_only():
    with pytest.raises(ValueError, match="sm_90 only"):
        sk.check_any_config(sk.WgmmaStreamKConfig(), 4096, 4096, "sm_120")
    import tune_sm120_nvfp4_w4a16_gemm as tune

    for m in (1, 64, 256):
        assert any(isinstance(c, sk.WgmmaStreamKConfig) for c in tune.candidates(m, 5120, 6144, "sm_90"))
        assert not any(isinstance(c, sk.WgmmaStreamKConfig) for c in tune.candidates(m, 5120, 6144, "sm_120"))


def test_streamk_config_round_trips_through_a_table_entry():
    a_batched = sk.WgmmaStreamKConfig(32, 128, 6, 2, True, 1, True, 0, 2)
    for config in (sk.WgmmaStreamKConfig(96, 64, 5, 2), a_batched, sk.WgmmaStreamKConfig(256, 64, 4, 1, True, 2, True, 2)):
        entry = sk.config_to_json(config)
        assert entry["kind"] == "WgmmaStreamKConfig" and sk.config_from_json(entry) == config
    del entry["config"]["streamk_waves"], entry["config"]["a_batches"]  # a table written before the fields: plain stream-K, one batch
    assert sk.config_from_json(entry) == sk.WgmmaStreamKConfig(256, 64, 4, 1, True, 2, True)


@needs_sm90
def test_streamk_graph_replays_match_eager():
    n, k, m = 5120, 6144, 256
    w = nv.prepare_nvfp4_weight(*nv.random_nvfp4_weight(n, k, "cuda"))
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for tma_loads in (False, True):
        config = sk.WgmmaStreamKConfig(128, 64, 4, 2, tma_loads)
        assert nv.graph_replays_match_eager(lambda x: sk.nvfp4_w4a16_linear(x, w, config), x)


def test_two_warpgroup_pairs_batch_one_k32_block():
    """Two CTAs per SM of two consumer warpgroups and a producer (96 registers a consumer): the check
    refuses 128-deep k tiles in two wgmma batches, whose wgmmas ptxas serializes at 32 x rows (C7512)
    with 48 operand registers, under the operand limit; four batches of one k32 block compile
    asynchronous (``SHARED_SM_PRODUCER_BATCHED_K32``)."""
    import tilelang

    refused = sk.WgmmaStreamKConfig(32, 128, 4, 2, True, 2, True, 0, 2)
    with pytest.raises(ValueError, match="one k32 block per wgmma batch"):
        sk.check_wgmma_streamk_config(refused, 34816, 5120)
    kernel = tilelang.compile(
        sk.build_wgmma_streamk_kernel(34816, 5120, refused), target={"kind": "cuda", "arch": wg.WGMMA_ARCH}, pass_configs=sk.STREAMK_PASS_CONFIGS
    )
    assert "C7512" in ptxas_report(kernel.get_kernel_source())
    allowed = refused._replace(a_batches=4)
    assert "C7512" not in ptxas_report(sk.compile_any(34816, 5120, allowed, "sm_90").get_kernel_source())
