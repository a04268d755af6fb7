"""The front door `pyspk.plan` on the fake driver (an 8.9 device of 34 SMs, sm80 tier):
any of the vocabulary's names for a boundary plans the entry the area's driver pin gives,
an explicit pin is honoured, and what no plan serves is refused before anything is
allocated. And the top level stays narrow and documented."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pyspk
from pyspk import CudaMath, Fp16Policy, Site
from pyspk.candidate import BoundaryId
from pyspk.candidate.segdense import Area, Entry, Products, SegdensePin
from pyspk.cuda.errors import InvalidArgument
from pyspk.errors import GeometryInvalid, GeometryUnimplemented

README = Path(__file__).resolve().parents[1] / "README.md"


def _operands(runtime, site: Site):
    _, n, k, _ = site.dimensions()
    weight = runtime.upload(np.full(n * k, 0.5, np.float32))
    bias = None if site.is_conv() else runtime.upload(np.zeros(n, np.float32))
    return weight, bias


@pytest.mark.parametrize("site", list(Site), ids=lambda site: site.name)
@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("math", list(CudaMath), ids=str)
def test_every_name_of_a_boundary_plans_the_area_pick(runtime, site, batch, math) -> None:
    weight, bias = _operands(runtime, site)
    tier = runtime.load_kernels(Area.AREA).tier
    want = Area.driver_pin(site.boundary(), batch, math, runtime.device, tier, Fp16Policy.ALLOW)
    for name in (site, site.framework_site(), site.boundary(), BoundaryId.named(site.value)):
        planned = pyspk.plan(runtime, name, batch, math, weight, bias)
        assert planned.producer.pin == want, name
        planned.close()


def test_an_explicit_pin_is_honoured(runtime) -> None:
    weight, bias = _operands(runtime, Site.EMBEDDING)
    tier = runtime.load_kernels(Area.AREA).tier
    pin = SegdensePin.forced(Entry.EMBED_B32_X3, CudaMath.FP32, tier, runtime.device)
    planned = pyspk.plan(runtime, Site.EMBEDDING, 32, CudaMath.FP32, weight, bias, pin=pin)
    assert planned.producer.pin == pin
    planned.close()


def test_forbidden_fp16_plans_no_fp16_product(runtime) -> None:
    for site in Site:
        weight, bias = _operands(runtime, site)
        for batch in (1, 32):
            planned = pyspk.plan(
                runtime, site, batch, CudaMath.TF32, weight, bias, fp16=Fp16Policy.FORBID
            )
            assert planned.producer.pin.entry().products() is not Products.FP16
            planned.close()


def test_what_no_plan_serves_is_refused_before_allocating(runtime, fake) -> None:
    weight, bias = _operands(runtime, Site.LINEAR0)
    conv_weight, _ = _operands(runtime, Site.CONV1)
    allocated = len(fake.memory)
    with pytest.raises(GeometryUnimplemented, match=r"linear0 batch 2 fp32"):
        pyspk.plan(runtime, Site.LINEAR0, 2, CudaMath.FP32, weight, bias)
    with pytest.raises(GeometryInvalid, match="needs its bias"):
        pyspk.plan(runtime, Site.LINEAR0, 1, CudaMath.FP32, weight)
    with pytest.raises(GeometryInvalid, match="takes no bias"):
        pyspk.plan(runtime, Site.CONV1, 1, CudaMath.FP32, conv_weight, bias)
    with pytest.raises(GeometryUnimplemented, match=r"resnet\.seg_2"):
        pyspk.plan(runtime, BoundaryId.named("resnet.seg_2"), 1, CudaMath.FP32, weight, bias)
    with pytest.raises(InvalidArgument, match="'linear0'"):
        pyspk.plan(runtime, "linear0", 1, CudaMath.FP32, weight, bias)
    assert len(fake.memory) == allocated


def test_the_conversions_are_total_and_inverse() -> None:
    for site in Site:
        assert Site.of(site) is site
        assert Site.of(site.framework_site()) is site
        assert Site.of(site.boundary()) is site
        assert site.boundary().name() == site.value


def test_the_top_level_is_narrow_and_documented() -> None:
    """At most 20 names, each named in the README or docs/kernels.md."""
    assert len(pyspk.__all__) <= 20
    text = README.read_text() + (README.parent / "docs" / "kernels.md").read_text()
    undocumented = [
        name for name in pyspk.__all__ if not re.search(rf"`(pyspk\.)?{re.escape(name)}\b", text)
    ]
    assert not undocumented
