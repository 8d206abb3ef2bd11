"""Head widths the H200's fused attention kernels take: every GPU preset's Baseline and SMELT
(matched with d_head_multiple 8) are eligible for cuDNN, memory-efficient and flash attention,
with flash doing at least 87.5% useful work for SMELT (the Baselines of d_head 48 run flash's
64-wide kernel at 75%); the even-only match they replaced (d_head 44) was eligible for flash
alone, at 69%. The matcher's own table gives the shapes; CPU presets, which have no aligned
match, keep their even widths."""

from __future__ import annotations

import pytest

from benchmarks.gpu_shapes import GPU_PRESETS, eligible_backends, flash_width, preset_heads
from smelt_interp.budget import match_smelt
from smelt_interp.errors import MatchError
from smelt_interp.train.config import TrainConfig
from smelt_interp.train.presets import get_preset

# (preset, arch) -> (n_heads, n_kv_heads, d_head): what match_smelt gives at d_head_multiple 8
EXPECTED = {
    ("sink-pair-gpu", "baseline"): (8, 4, 48),
    ("sink-pair-gpu", "smelt"): (8, 4, 32),
    ("lm-pair-gpu", "baseline"): (8, 4, 48),
    ("lm-pair-gpu", "smelt"): (8, 4, 32),
    ("paper-200m", "baseline"): (12, 4, 64),
    ("paper-200m", "smelt"): (9, 3, 56),
}


def test_the_rules_table_by_hand() -> None:
    assert eligible_backends(44) == {
        "cudnn": False, "efficient": False, "flash": True, "flash_useful": 44 / 64
    }  # fmt: skip
    assert eligible_backends(56) == {
        "cudnn": True, "efficient": True, "flash": True, "flash_useful": 56 / 64
    }  # fmt: skip
    assert eligible_backends(160)["cudnn"] is False and flash_width(160) == 160
    assert flash_width(22) == 32 and flash_width(257) is None


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_every_gpu_preset_is_eligible_for_every_fused_kernel(preset: str) -> None:
    assert get_preset(preset)["d_head_multiple"] == 8
    heads = preset_heads(preset)
    for arch, shape in heads.items():
        assert tuple(shape.values()) == EXPECTED[(preset, arch)]
        rules = eligible_backends(shape["d_head"])
        assert rules["cudnn"] and rules["efficient"] and rules["flash"], (preset, arch, rules)
        assert rules["flash_useful"] >= (0.875 if arch == "smelt" else 0.75)  # Baseline 48: 75%
    # the even-only match of the same Baseline: the head width the fast kernels refused
    cfg = TrainConfig.from_dict(get_preset(preset))
    even = match_smelt(cfg.model, seq_len=cfg.batch.seq_len).smelt
    assert even.d_head == 44 and not eligible_backends(even.d_head)["efficient"]


@pytest.mark.parametrize("preset", ["dyck-pair", "dyck-pair-tiny"])
def test_cpu_presets_have_no_aligned_match_and_keep_their_own(preset: str) -> None:
    cfg = TrainConfig.from_dict(get_preset(preset))
    assert cfg.d_head_multiple == 2
    with pytest.raises(MatchError):
        match_smelt(cfg.model, seq_len=cfg.batch.seq_len, d_head_multiple=8)
    assert preset_heads(preset)["smelt"]["d_head"] == 22


def test_d_head_multiple_is_checked() -> None:
    for bad in (4, 8.0, True, "8"):
        with pytest.raises(Exception, match="d_head_multiple must be one of 2, 8, 16"):
            TrainConfig.from_dict({**get_preset("dyck-pair-tiny"), "d_head_multiple": bad})


def test_the_kernel_friendly_preset_runs_flash_with_no_padding() -> None:
    """paper-200m-k64 (budget.kernel): both models' heads 64 wide, so every fused kernel takes
    them and flash's 64-wide kernel does only useful work (paper-200m's SMELT: 56 of 64)."""
    heads = preset_heads("paper-200m-k64")
    assert heads == {
        "baseline": {"n_heads": 12, "n_kv_heads": 3, "d_head": 64},
        "smelt": {"n_heads": 10, "n_kv_heads": 2, "d_head": 64},
    }
    for shape in heads.values():
        rules = eligible_backends(shape["d_head"])
        assert rules["cudnn"] and rules["efficient"] and rules["flash_useful"] == 1.0
    assert eligible_backends(EXPECTED[("paper-200m", "smelt")][2])["flash_useful"] == 0.875
