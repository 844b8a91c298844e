"""The launch rules size their grids from the device's facts (kernels/_common.device_facts),
asked from the driver; no chip's SM count is written in the kernels."""
from __future__ import annotations


import pytest

import nbxtensor as nbx
from nbxtensor.backends.cuda import driver as drv
from nbxtensor.kernels import _common
from fakes import FakeAttributeDriver, MAX_THREADS_PER_MULTIPROCESSOR  # noqa: E402


@pytest.fixture
def fake_gpu(monkeypatch):
    def install(sms):
        fake = FakeAttributeDriver(sms)
        monkeypatch.setattr(drv, "_fns", {"cuDeviceGetAttribute": fake})
        monkeypatch.setattr(_common, "_CUDA", {})
        return fake
    return install


def _configs(dev):
    """Grid-sizing outputs of the rules that read the SM count."""
    from nbxtensor.kernels import decode_attention as DA, decode_fused as F, gemv as G
    from nbxtensor.kernels import matmul as MM, quant_fused as QF, softmax as S
    return dict(
        fused_gemv=F.fused_gemv_config(1, 4096, 3000, 2, dev),
        qfused=QF.qfused_config(1, 2048, 64, "Q8_0", dev)["BLOCK_N"],
        gemv_target=G.gemv_config(1, 4096, 4096, nbx.bfloat16, dev)["TARGET"],
        softmax_split=S.split_config(200, 128256, dev),
        decode_splits=DA.decode_config(1, 8, 4096, 128, 128, 2, dev)["P"],
        matmul_split=MM.splitk_factor(128, 2048, 8192, 64, 64, 2, dev, 64, 64),
    )


# today's configs on the H200 (132 SMs), written out
H200_CONFIGS = dict(fused_gemv=dict(BLOCK_N=8, BLOCK_K=512, num_warps=4), qfused=4,
                    gemv_target=528, softmax_split=(43008, 3), decode_splits=17,
                    matmul_split=2)


def test_facts_come_from_the_driver(fake_gpu):
    fake = fake_gpu(114)
    f = _common.device_facts(nbx.device("cuda:1"))
    assert f == _common.DeviceFacts("cuda", sms=114, l2_bytes=52428800, smem_per_block=232448,
                                    regs_per_sm=65536, threads_per_sm=2048)
    assert sorted(fake.asked) == [(16, 1), (38, 1), (39, 1), (75, 1), (76, 1), (82, 1), (97, 1)]
    assert _common.device_facts(nbx.device("cuda:1")) is f      # asked once per device
    assert len(fake.asked) == 7
    assert _common.device_facts(nbx.device("interp")) is _common.INTERP
    with pytest.raises(ValueError, match="must be cuda or interp, got cpu"):
        _common.device_facts(nbx.device("cpu"))


def test_an_h200_shaped_device_gets_todays_configs(fake_gpu):
    fake_gpu(132)
    assert _configs(_common.device_facts(nbx.device("cuda"))) == H200_CONFIGS


@pytest.mark.parametrize("sms", [66, 114])
def test_other_sm_counts_change_the_grids(fake_gpu, sms):
    fake_gpu(sms)
    got = _configs(_common.device_facts(nbx.device("cuda")))
    assert got["gemv_target"] == 4 * sms
    assert got["decode_splits"] == -(-sms // 8)
    if sms == 66:
        assert got["fused_gemv"] == dict(BLOCK_N=16, BLOCK_K=256, num_warps=4)
        assert got["softmax_split"] is None               # 200 rows: 3 a SM already
        assert got["qfused"] == 8
    assert got != H200_CONFIGS


def test_interp_keeps_the_h200_shaped_grids():
    """interp has no hardware: its nominal machine launches the grids of an H200."""
    assert _common.INTERP.sms == 132
    from nbxtensor.kernels import gemv as G
    assert G.gemv_config(1, 4096, 4096, nbx.bfloat16, _common.INTERP)["TARGET"] == 528


def _grids(device):
    """Grid sizes of the sort, reduction and autotune-space rules that read the SM count, on
    `device` (a Device: these rules look its facts up themselves)."""
    from nbxtensor.autotune import space
    from nbxtensor.kernels import reduction as R, sort as S
    sms = _common.device_facts(device).sms
    cfg = S.CONFIG["cuda"]
    rec = R._recipe("cuda", sms, 4, 4096 * 1000, 4096, 1000, 1, 1000, 1, 0, 1, 0,
                    (R.P_ID, R.C_SUM, R.Q_NONE, R.A_F32), True, False, False)
    return dict(
        topk_programs=S._programs(cfg, "topk_programs", device),
        rank_small_grid=S._programs(cfg, "rank_small_grid", device),
        reduce_split=R._plan("cuda", R._sms(device), 1, 1 << 26, 1, 4)[3],
        reduce_pipe_grid=rec[2],
        scan_min_programs=R.SCAN_CONFIG["cuda"]["min_programs_per_sm"] * R._sms(device),
        gemv_targets=sorted({c["TARGET"] for c in space.gemv_candidates("bfloat16", 1, sms)}),
        decode_targets=sorted({c["TARGET"] for c in space.decode_candidates("bfloat16", sms)}),
    )


# the H200's (132 SMs), as the constants wrote them before they were rules over the facts
H200_GRIDS = dict(topk_programs=264, rank_small_grid=132, reduce_split=1024,
                  reduce_pipe_grid=(528,), scan_min_programs=132,
                  gemv_targets=[264, 528, 1056], decode_targets=[132, 264, 396, 528])


def test_sort_reduction_and_space_on_an_h200(fake_gpu):
    fake_gpu(132)
    assert _grids(nbx.device("cuda")) == H200_GRIDS


@pytest.mark.parametrize("sms", [66, 114])
def test_sort_reduction_and_space_follow_the_sms(fake_gpu, sms):
    fake_gpu(sms)
    got = _grids(nbx.device("cuda"))
    assert got["topk_programs"] == 2 * sms and got["rank_small_grid"] == sms
    assert got["reduce_pipe_grid"] == (4 * sms,) and got["scan_min_programs"] == sms
    assert got["gemv_targets"] == [2 * sms, 4 * sms, 8 * sms]
    assert got["decode_targets"] == [sms, 2 * sms, 3 * sms, 4 * sms]
    if sms == 66:
        assert got["reduce_split"] == 512          # 8 programs a SM: 528, in whole chunks
    # an entry tuned on a 132-SM device is outside this device's space (the rule runs)
    from nbxtensor.autotune import space
    h200 = dict(BLOCK_M=1, BLOCK_N=16, BLOCK_K=128, num_warps=4, num_stages=4, TARGET=1056)
    assert space.get_tunable("gemv").contains(h200, "bfloat16", 132)
    assert not space.get_tunable("gemv").contains(h200, "bfloat16", sms)


def test_interp_grids_are_the_interpreters():
    """interp sizes these rules for the interpreter (few programs), not for the nominal
    H200: sort's counts are written out, reductions count INTERP_SMS = 2 SMs."""
    from nbxtensor.kernels import reduction as R, sort as S
    dev = nbx.device("interp")
    assert S._programs(S.CONFIG["interp"], "topk_programs", dev) == 8
    assert S._programs(S.CONFIG["interp"], "rank_small_grid", dev) == 8
    assert R._sms(dev) == 2
    assert R.CONFIG["interp"]["target_programs_per_sm"] * R._sms(dev) == 4


def test_random_draws_size_their_threads_from_the_facts(fake_gpu):
    """kernels/random.py's policy (torch's: grid = SMs x threads an SM / 256, capped by the
    elements) reads both from the device; interp draws as the nominal H200."""
    from nbxtensor.kernels import random as KR
    n = 1 << 24
    assert KR.policy(n, 4, nbx.device("interp")) == (132 * 2048, 16, 64)
    fake = fake_gpu(66)
    fake.values[MAX_THREADS_PER_MULTIPROCESSOR] = 1536
    assert KR.sm_facts(nbx.device("cuda")) == (66, 1536)
    T, calls, inc = KR.policy(n, 4, nbx.device("cuda"))
    assert T == 256 * 66 * 6 and calls == -(-n // (T * 4)) and inc == 4 * calls


def test_a_sweep_screens_the_devices_waves(fake_gpu):
    """autotune's sweep of a gemv / decode attention key times TARGETs in waves of the
    device's SMs, the space `pick` admits there."""
    from nbxtensor.autotune import space, sweep
    fake_gpu(114)
    gemv = sweep.candidates_for("gemv", (1, 4096, 4096), "bfloat16", "cuda")
    dec = sweep.candidates_for("decode_attention", (8, 4096, 4, 128), "bfloat16", "cuda")
    assert {c["TARGET"] for c in gemv} == {228, 456, 912}
    assert dec and all(c["TARGET"] % 114 == 0 for c in dec)
    t = space.get_tunable("gemv")
    assert all(t.contains(c, "bfloat16", 114) for c in gemv)
