"""Device profiles, and the device rule's picks on three of them against tables written
by hand from the reference implementation's device rule (not from the code under
test)."""

from __future__ import annotations

import pytest

from pyspk.candidate.segdense.pins import TUPLES, pick_table
from pyspk.cuda.device import DeviceAttributes
from pyspk.cuda.math import CudaMath
from pyspk.cuda.profiles import PROFILES, profile, profile_key
from pyspk.cuda.tier import ComputeCapability, PtxTier, loadable_tier

KIB = 1024

# key -> (capability, multiprocessors): the published figures the profiles must carry
EXPECTED = {
    "t4": ("7.5", 40),
    "a10": ("8.6", 72),
    "a30": ("8.0", 56),
    "a100": ("8.0", 108),
    "l4": ("8.9", 58),
    "l40s": ("8.9", 142),
    "rtx3090": ("8.6", 82),
    "rtx4090": ("8.9", 128),
    "rtx4060ti": ("8.9", 34),
    "h100-sxm": ("9.0", 132),
    "h100-pcie": ("9.0", 114),
    "h200": ("9.0", 132),
    "b200": ("10.0", 148),
    "rtx5060ti": ("12.0", 36),
    "rtx5090": ("12.0", 170),
}

# opt-in shared memory per block by architecture, per the CUDA programming guide
OPTIN = {
    (7, 5): 64 * KIB,
    (8, 0): 163 * KIB,
    (8, 6): 99 * KIB,
    (8, 9): 99 * KIB,
    (9, 0): 227 * KIB,
    (10, 0): 227 * KIB,
    (12, 0): 99 * KIB,
}


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_required_profile_has_published_figures(key: str) -> None:
    device = PROFILES[key]
    capability, sms = EXPECTED[key]
    assert isinstance(device, DeviceAttributes)
    assert str(device.capability) == capability
    assert device.multiprocessors == sms
    major, minor = device.capability.major, device.capability.minor
    assert device.shared_optin_bytes == OPTIN[major, minor]
    # L2 is whole MiB and between the T4's 4 MiB and the B200's 126 MiB
    assert device.l2_bytes % (1024 * 1024) == 0
    assert 4 * 1024 * 1024 <= device.l2_bytes <= 126 * 1024 * 1024
    assert device.name.startswith("NVIDIA ")


def test_opt_in_figures_are_the_architecture_values_in_bytes() -> None:
    assert PROFILES["t4"].shared_optin_bytes == 65536
    assert PROFILES["a100"].shared_optin_bytes == 166912
    assert PROFILES["rtx4060ti"].shared_optin_bytes == 101376
    assert PROFILES["h200"].shared_optin_bytes == 232448
    assert PROFILES["b200"].shared_optin_bytes == 232448


def test_profiles_are_ordered_by_capability_then_name() -> None:
    keys = list(PROFILES)
    assert keys == sorted(keys, key=lambda key: (PROFILES[key].capability, key))
    assert keys[0] == "t4"
    assert set(EXPECTED) <= set(keys)
    assert len({device.name for device in PROFILES.values()}) == len(keys)
    assert all(key == key.lower() and " " not in key for key in keys)


def test_every_profile_loads_a_shipped_tier() -> None:
    for device in PROFILES.values():
        assert device.multiprocessors > 0
        assert loadable_tier(device.capability) in (PtxTier.SM75, PtxTier.SM80)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("h200", "h200"),
        ("H200", "h200"),
        ("  h200 ", "h200"),
        ("RTX 4060 Ti", "rtx4060ti"),
        ("rtx_4060_ti", "rtx4060ti"),
        ("NVIDIA GeForce RTX 4060 Ti", "rtx4060ti"),
        ("h100_sxm", "h100-sxm"),
        ("H100 SXM", "h100-sxm"),
        ("h100-PCIe", "h100-pcie"),
        ("Tesla T4", "t4"),
        ("RTX5060Ti", "rtx5060ti"),
        ("L40S", "l40s"),
    ],
)
def test_profile_accepts_name_variants(text: str, key: str) -> None:
    assert profile_key(text) == key
    assert profile(text) is PROFILES[key]


def test_unknown_profile_lists_the_known_names() -> None:
    with pytest.raises(KeyError) as raised:
        profile("v100")
    message = raised.value.args[0]
    assert "'v100'" in message
    for key in PROFILES:
        assert key in message
    with pytest.raises(KeyError):
        profile("")


# --- the device rule on three profiles, by hand ----------------------------------------

# entry -> (kernel, block, dynamic shared bytes), the reference's table of entries. The
# tensor convolutions' shared memory is 4 * max(3 * (8 * (128 + 16) + 2560 * planes),
# 64 * (128 + 8)): 44544 for one TF32 plane, 75264 for the two 3xTF32 planes. The FP16
# embedding's is 4 * (96 + max(96 * (160 + 4) + 3 * 16 * 136, 192 * 32 * 64 / 32)) = 89472.
LAUNCH = {
    "CONV1_B1": ("spk_segdense_conv1_b1", 256, 0),
    "CONV1_B32": ("spk_segdense_conv1_b32", 128, 0),
    "CONV1_B32_TC": ("spk_segdense_conv1_b32_tc", 128, 44544),
    "CONV1_B32_X3": ("spk_segdense_conv1_b32_x3", 256, 75264),
    "CONV2_B1": ("spk_segdense_conv2_b1", 256, 0),
    "CONV2_B32": ("spk_segdense_conv2_b32", 128, 0),
    "CONV2_B32_TC": ("spk_segdense_conv2_b32_tc", 128, 44544),
    "CONV2_B32_X3": ("spk_segdense_conv2_b32_x3", 256, 75264),
    "LINEAR0_B1": ("spk_segdense_linear0_b1", 128, 0),
    "LINEAR0_B1_TF32": ("spk_segdense_linear0_b1_tf32", 128, 0),
    "LINEAR0_B32": ("spk_segdense_linear0_b32", 128, 0),
    "LINEAR0_B32_SELECT": ("spk_segdense_linear0_b32_tf32", 128, 0),
    "LINEAR1_B1": ("spk_segdense_linear1_b1", 128, 0),
    "LINEAR1_B1_TF32": ("spk_segdense_linear1_b1_tf32", 128, 0),
    "LINEAR1_B32": ("spk_segdense_linear1_b32", 128, 0),
    "LINEAR1_B32_TF32": ("spk_segdense_linear1_b32_tf32", 128, 0),
    "CLASSIFIER_B1": ("spk_segdense_classifier_b1", 64, 0),
    "CLASSIFIER_B32": ("spk_segdense_classifier_b32", 256, 0),
    "EMBED_B1": ("spk_segdense_embed_b1", 256, 0),
    "EMBED_B32": ("spk_segdense_embed_b32", 192, 0),
    "EMBED_B32_TF32": ("spk_segdense_embed_b32_tf32", 192, 0),
    "EMBED_B32_TF32_K2": ("spk_segdense_embed_b32_tf32_k2", 384, 0),
    "EMBED_B32_TF32_E64": ("spk_segdense_embed_b32_tf32_e64", 192, 0),
    "EMBED_B32_X3": ("spk_segdense_embed_b32_x3", 192, 0),
    "EMBED_B32_F16": ("spk_segdense_embed_b32_f16", 384, 89472),
}

# (boundary, batch, math) -> (entry, split-K slices or None), 24 rows in tuple order.
# H200, sm80: 9.0 is tensor-heavy, so batch-32 convolutions run 3xTF32 (fp32) or TF32
# (tf32), and the embedding runs 96 x 64 tiles with 132 * 2 / 4 = 66 slices.
H200_SM80 = [
    ("sincnet.conv1", 1, "fp32", "CONV1_B1", None),
    ("sincnet.conv1", 1, "tf32", "CONV1_B1", None),
    ("sincnet.conv1", 32, "fp32", "CONV1_B32_X3", None),
    ("sincnet.conv1", 32, "tf32", "CONV1_B32_TC", None),
    ("sincnet.conv2", 1, "fp32", "CONV2_B1", None),
    ("sincnet.conv2", 1, "tf32", "CONV2_B1", None),
    ("sincnet.conv2", 32, "fp32", "CONV2_B32_X3", None),
    ("sincnet.conv2", 32, "tf32", "CONV2_B32_TC", None),
    ("linear0", 1, "fp32", "LINEAR0_B1", None),
    ("linear0", 1, "tf32", "LINEAR0_B1_TF32", None),
    ("linear0", 32, "fp32", "LINEAR0_B32", None),
    ("linear0", 32, "tf32", "LINEAR0_B32_SELECT", None),
    ("linear1", 1, "fp32", "LINEAR1_B1", None),
    ("linear1", 1, "tf32", "LINEAR1_B1_TF32", None),
    ("linear1", 32, "fp32", "LINEAR1_B32", None),
    ("linear1", 32, "tf32", "LINEAR1_B32_TF32", None),
    ("linear2", 1, "fp32", "CLASSIFIER_B1", None),
    ("linear2", 1, "tf32", "CLASSIFIER_B1", None),
    ("linear2", 32, "fp32", "CLASSIFIER_B32", None),
    ("linear2", 32, "tf32", "CLASSIFIER_B32", None),
    ("resnet.seg_1", 1, "fp32", "EMBED_B1", None),
    ("resnet.seg_1", 1, "tf32", "EMBED_B1", None),
    ("resnet.seg_1", 32, "fp32", "EMBED_B32_X3", 66),
    ("resnet.seg_1", 32, "tf32", "EMBED_B32_TF32_E64", 66),
]

# RTX 4060 Ti, sm80: 8.9 is not tensor-heavy, so batch-32 convolutions and the FP32
# embedding stay SIMT (34 * 2 / 2 = 34 slices); TF32 linears still take tensor cores; the
# FP16 embedding fits (34 / 2 = 17 >= 16 slices, 89472 <= 101376 bytes) with 17 slices.
RTX4060TI_SM80 = [
    ("sincnet.conv1", 1, "fp32", "CONV1_B1", None),
    ("sincnet.conv1", 1, "tf32", "CONV1_B1", None),
    ("sincnet.conv1", 32, "fp32", "CONV1_B32", None),
    ("sincnet.conv1", 32, "tf32", "CONV1_B32", None),
    ("sincnet.conv2", 1, "fp32", "CONV2_B1", None),
    ("sincnet.conv2", 1, "tf32", "CONV2_B1", None),
    ("sincnet.conv2", 32, "fp32", "CONV2_B32", None),
    ("sincnet.conv2", 32, "tf32", "CONV2_B32", None),
    ("linear0", 1, "fp32", "LINEAR0_B1", None),
    ("linear0", 1, "tf32", "LINEAR0_B1_TF32", None),
    ("linear0", 32, "fp32", "LINEAR0_B32", None),
    ("linear0", 32, "tf32", "LINEAR0_B32_SELECT", None),
    ("linear1", 1, "fp32", "LINEAR1_B1", None),
    ("linear1", 1, "tf32", "LINEAR1_B1_TF32", None),
    ("linear1", 32, "fp32", "LINEAR1_B32", None),
    ("linear1", 32, "tf32", "LINEAR1_B32_TF32", None),
    ("linear2", 1, "fp32", "CLASSIFIER_B1", None),
    ("linear2", 1, "tf32", "CLASSIFIER_B1", None),
    ("linear2", 32, "fp32", "CLASSIFIER_B32", None),
    ("linear2", 32, "tf32", "CLASSIFIER_B32", None),
    ("resnet.seg_1", 1, "fp32", "EMBED_B1", None),
    ("resnet.seg_1", 1, "tf32", "EMBED_B1", None),
    ("resnet.seg_1", 32, "fp32", "EMBED_B32", 34),
    ("resnet.seg_1", 32, "tf32", "EMBED_B32_F16", 17),
]

# T4, sm75: only the scalar rule; linear1 batch 1 TF32 keeps its TF32 entry (plain SIMT in
# the sm75 module), and the embedding splits 40 * 2 / 2 = 40 ways in both maths.
T4_SM75 = [
    ("sincnet.conv1", 1, "fp32", "CONV1_B1", None),
    ("sincnet.conv1", 1, "tf32", "CONV1_B1", None),
    ("sincnet.conv1", 32, "fp32", "CONV1_B32", None),
    ("sincnet.conv1", 32, "tf32", "CONV1_B32", None),
    ("sincnet.conv2", 1, "fp32", "CONV2_B1", None),
    ("sincnet.conv2", 1, "tf32", "CONV2_B1", None),
    ("sincnet.conv2", 32, "fp32", "CONV2_B32", None),
    ("sincnet.conv2", 32, "tf32", "CONV2_B32", None),
    ("linear0", 1, "fp32", "LINEAR0_B1", None),
    ("linear0", 1, "tf32", "LINEAR0_B1", None),
    ("linear0", 32, "fp32", "LINEAR0_B32", None),
    ("linear0", 32, "tf32", "LINEAR0_B32", None),
    ("linear1", 1, "fp32", "LINEAR1_B1", None),
    ("linear1", 1, "tf32", "LINEAR1_B1_TF32", None),
    ("linear1", 32, "fp32", "LINEAR1_B32", None),
    ("linear1", 32, "tf32", "LINEAR1_B32", None),
    ("linear2", 1, "fp32", "CLASSIFIER_B1", None),
    ("linear2", 1, "tf32", "CLASSIFIER_B1", None),
    ("linear2", 32, "fp32", "CLASSIFIER_B32", None),
    ("linear2", 32, "tf32", "CLASSIFIER_B32", None),
    ("resnet.seg_1", 1, "fp32", "EMBED_B1", None),
    ("resnet.seg_1", 1, "tf32", "EMBED_B1", None),
    ("resnet.seg_1", 32, "fp32", "EMBED_B32", 40),
    ("resnet.seg_1", 32, "tf32", "EMBED_B32", 40),
]


def expected_dicts(rows: list[tuple[str, int, str, str, int | None]]) -> list[dict]:
    return [
        {
            "boundary": boundary,
            "batch": batch,
            "math": math,
            "entry": entry,
            "kernel": LAUNCH[entry][0],
            "splits": splits,
            "block": LAUNCH[entry][1],
            "shared": LAUNCH[entry][2],
            "built": True,  # both shipped tiers carry all 32 entries
        }
        for boundary, batch, math, entry, splits in rows
    ]


@pytest.mark.parametrize(
    ("key", "tier", "rows"),
    [
        ("h200", PtxTier.SM80, H200_SM80),
        ("rtx4060ti", PtxTier.SM80, RTX4060TI_SM80),
        ("t4", PtxTier.SM75, T4_SM75),
    ],
)
def test_picks_match_the_hand_written_table(key: str, tier: PtxTier, rows: list) -> None:
    device = PROFILES[key]
    assert loadable_tier(device.capability) is tier
    picks = pick_table(device, tier)
    assert len(picks) == 24
    assert [pick.as_dict() for pick in picks] == expected_dicts(rows)


def test_tuples_are_site_then_batch_then_math() -> None:
    assert len(TUPLES) == 24
    assert [(site.value, batch, str(math)) for site, batch, math in TUPLES] == [
        (boundary, batch, math) for boundary, batch, math, _, _ in H200_SM80
    ]
    assert TUPLES[-1][2] is CudaMath.TF32


@pytest.mark.parametrize(
    ("capability", "sms", "shared", "tf32", "fp32"),
    [
        # 12.x: FP16 split when 36 / 2 = 18 >= 16 slices fit
        ("12.0", 36, 99 * KIB, ("EMBED_B32_F16", 18), ("EMBED_B32", 36)),
        # 12.x below 16 FP16 slices: the one-block-per-SM k-split, 30 / 2 = 15 slices
        ("12.0", 30, 99 * KIB, ("EMBED_B32_TF32_K2", 15), ("EMBED_B32", 30)),
        # 8.9 below 16 FP16 slices: two 192-thread blocks per SM, 30 * 2 / 2 slices
        ("8.9", 30, 99 * KIB, ("EMBED_B32_TF32", 30), ("EMBED_B32", 30)),
        # 8.9 without the FP16 kernel's 89472 bytes of shared memory
        ("8.9", 34, 64 * KIB, ("EMBED_B32_TF32", 34), ("EMBED_B32", 34)),
        # many SMs: slices clamp at 128
        ("12.0", 170, 99 * KIB, ("EMBED_B32_F16", 85), ("EMBED_B32", 128)),
        # 10.0 is tensor-heavy: 148 * 2 / 4 = 74
        ("10.0", 148, 227 * KIB, ("EMBED_B32_TF32_E64", 74), ("EMBED_B32_X3", 74)),
        # one SM: at least one slice
        ("8.0", 1, 163 * KIB, ("EMBED_B32_TF32_E64", 1), ("EMBED_B32_X3", 1)),
    ],
)
def test_embedding_batch32_rule_by_hand(
    capability: str, sms: int, shared: int, tf32: tuple, fp32: tuple
) -> None:
    device = DeviceAttributes(
        ComputeCapability.parse(capability), multiprocessors=sms, shared_optin_bytes=shared
    )
    picks = {pick.key(): pick for pick in pick_table(device, PtxTier.SM80)}
    for math, (entry, splits) in (("tf32", tf32), ("fp32", fp32)):
        pick = picks["resnet.seg_1", 32, math]
        assert (pick.entry, pick.splits) == (entry, splits)
        assert (pick.kernel, pick.block, pick.shared) == LAUNCH[entry]


@pytest.mark.parametrize(
    ("smi_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H200", "h200"),
        ("Tesla T4", "t4"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA GeForce RTX 4060 Ti", "rtx4060ti"),
    ],
)
def test_nvidia_smi_names_resolve(smi_name: str, key: str) -> None:
    """The names `nvidia-smi` prints, with memory sizes and form factors."""
    assert profile_key(smi_name) == key


def test_an_ambiguous_name_lists_the_candidates() -> None:
    with pytest.raises(KeyError, match="ambiguous: it may be h100-pcie, h100-sxm"):
        profile_key("h100")
    with pytest.raises(KeyError, match="unknown device 'NVIDIA H100 NVL'"):
        profile_key("NVIDIA H100 NVL")
