#!/usr/bin/env python3
"""Layer1's sm90 forms side by side: the strip form against the 2D-tile form.

    PYTHONPATH=. python3 tools/trunk_forms.py [--rounds 7] [--launches 20] [--out FILE]
        [--variant GROUPS,ROWS,TILES,AHEAD=CUBIN ...]

On one H200 (the sm90 tier) and in one process: layer1's convolution
(`TrunkWeights.random(3)`) on random activations at batch 32 (each chunk at its own
level, 2^-6 to 2^6), in each math, without and with the residual (a block's first and
second convolutions). Each form's output on chunks 0 and 1 is compared with float64
(`pyspk.reference.trunk_conv`, norm-wise relative error), and its chunk maxima with the
strip form's; then each round times `--launches` launches of each form with CUDA
events, the forms in turn, and the median of the rounds is reported in microseconds a
launch. A `--variant` adds the tile entries of another build of the trunk module (a
cubin for sm_90a built with other TILE_GROUPS, TILE_ROWS, TILE_TILES and TILE_AHEAD),
launched with the geometry those constants give.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

SITE_NAME = "layer1_conv"


def _variant_kernel(spec: str, math) -> tuple[str, object, tuple]:
    """`GROUPS,ROWS,TILES,AHEAD=CUBIN` -> (label, Kernel, geometry) in `math`."""
    from pyspk.candidate.trunk.shapes import TrunkSite
    from pyspk.cuda import driver
    from pyspk.cuda.kernels import Kernel
    from pyspk.cuda.tier import PtxTier

    numbers, path = spec.split("=", 1)
    groups, rows, tiles, ahead = (int(n) for n in numbers.split(","))
    module = driver.call("cuModuleLoadData", Path(path).read_bytes())
    site = TrunkSite.LAYER1_CONV
    name = site.kernel(math, PtxTier.SM90)
    handle = driver.call("cuModuleGetFunction", module, name.encode())
    geometry = site.shape.tile_launch(site.splits(math), groups, rows, tiles, ahead)
    label = f"tiles g{groups} r{rows} t{tiles} a{ahead}"
    return label, Kernel(name, handle, None), geometry


def _timer(runtime) -> Callable[[Callable[[], None], int], float]:
    from pyspk.cuda import driver

    start, end = driver.call("cuEventCreate", 0), driver.call("cuEventCreate", 0)

    def time(launch: Callable[[], None], count: int) -> float:
        driver.call("cuEventRecord", start, runtime.stream)
        for _ in range(count):
            launch()
        driver.call("cuEventRecord", end, runtime.stream)
        driver.call("cuEventSynchronize", end)
        return float(driver.call("cuEventElapsedTime", start, end)) * 1000.0 / count

    return time


class _Buffers:
    """The inputs every form reads, on the device: x at chunk levels 2^-6 .. 2^6, its
    chunk maxima, a residual; one math's weight and bias."""

    def __init__(self, runtime, conv) -> None:
        from pyspk.candidate.trunk.shapes import TRUNK_BATCH

        shape = conv.site.shape
        rng = np.random.default_rng(0)
        levels = 2.0 ** rng.integers(-6, 7, TRUNK_BATCH)
        x = np.abs(rng.normal(size=(TRUNK_BATCH, shape.x_item))) * levels[:, None]
        self.x_host = x.astype(np.float32)
        self.residual_host = rng.normal(size=TRUNK_BATCH * shape.y_item).astype(np.float32)
        self.runtime, self.conv = runtime, conv
        self.x = runtime.upload(self.x_host)
        self.in_max = runtime.upload(np.abs(self.x_host).max(axis=1).view(np.int32), np.int32)
        self.residual = runtime.upload(self.residual_host)
        self.weight = self.bias = None
        self._truth: dict[bool, np.ndarray] = {}

    def truth(self, residual: bool) -> np.ndarray:
        """Chunks 0 and 1 of the convolution (+ residual, ReLU) in float64."""
        from pyspk import reference

        if residual not in self._truth:
            shape = self.conv.site.shape
            x = self.x_host[:2].reshape(2, shape.hin, shape.win, shape.cin)
            res = self.residual_host[: 2 * shape.y_item].reshape(2, shape.hout, shape.wout, -1)
            self._truth[residual] = reference.trunk_conv(
                x,
                self.conv.weight,
                self.conv.bias,
                1,
                residual=res if residual else None,
                relu=True,
            ).reshape(-1)
        return self._truth[residual]

    def use_math(self, math) -> None:
        self.weight = self.runtime.upload(self.conv.packed(self.conv.site.splits(math), True))
        self.bias = self.runtime.upload(self.conv.packed_bias())


class _Form:
    """One form's kernel and geometry, its own output and chunk maxima buffers."""

    def __init__(self, label: str, kernel, geometry, buffers: _Buffers) -> None:
        from pyspk.candidate.trunk.shapes import TRUNK_BATCH

        self.label, self.kernel, self.geometry, self.buffers = label, kernel, geometry, buffers
        kernel.set_max_dynamic_shared(geometry[2])
        self.y = buffers.runtime.alloc_zeros(TRUNK_BATCH * buffers.conv.site.shape.y_item)
        self.out_max = buffers.runtime.alloc_zeros(TRUNK_BATCH)

    def launcher(self, items: int, residual: bool) -> Callable[[], None]:
        from pyspk.candidate.trunk.plan import CONV_PARAMS
        from pyspk.candidate.trunk.shapes import CONV_RELU

        b = self.buffers
        res = [b.residual.ptr, len(b.residual)] if residual else [0, 0]
        values = [
            *(b.x.ptr, len(b.x), b.weight.ptr, len(b.weight), b.bias.ptr, len(b.bias)),
            *res,
            *(self.y.ptr, len(self.y), b.in_max.ptr, len(b.in_max)),
            *(self.out_max.ptr, len(self.out_max), items, CONV_RELU),
            0,  # x_map: layer1's forms take no tensor map
        ]
        launch = self.kernel.launch(*self.geometry, CONV_PARAMS, values)
        return launch.bind(b.runtime.stream)

    def bits(self, items: int, residual: bool) -> tuple[np.ndarray, np.ndarray]:
        """The output and chunk maxima of one launch on cleared buffers, as bits."""
        runtime = self.buffers.runtime
        runtime.write(self.y, np.zeros(len(self.y), np.float32))
        runtime.write(self.out_max, np.zeros(len(self.out_max), np.float32))
        self.launcher(items, residual)()
        return (
            runtime.download(self.y).view(np.uint32),
            runtime.download(self.out_max).view(np.uint32),
        )


def _compare(forms: list[_Form], residual: bool, rounds: int, launches: int, time) -> list[str]:
    """Per form: the median us a launch, its norm-wise error against float64 on chunks
    0 and 1, and whether its chunk maxima are the first form's, at 32 and at 11 chunks."""
    from pyspk.candidate.trunk.shapes import TRUNK_BATCH

    truth = forms[0].buffers.truth(residual)
    error: dict[str, float] = {}
    same: dict[str, list[bool]] = {form.label: [] for form in forms}
    for items in (TRUNK_BATCH, 11):
        _, first_max = forms[0].bits(items, residual)
        for form in forms:
            y, out_max = form.bits(items, residual)
            same[form.label].append(bool(np.array_equal(out_max, first_max)))
            if items == TRUNK_BATCH:
                got = y[: truth.size].view(np.float32).astype(np.float64)
                error[form.label] = float(np.linalg.norm(got - truth) / np.linalg.norm(truth))
    bound = [(form.label, form.launcher(TRUNK_BATCH, residual)) for form in forms]
    for _, launch in bound:
        time(launch, 3)  # warm-up
    times: dict[str, list[float]] = {label: [] for label, _ in bound}
    for _ in range(rounds):
        for label, launch in bound:
            times[label].append(time(launch, launches))
    return [
        f"residual={'yes' if residual else 'no '} {label:<16} "
        f"{statistics.median(times[label]):8.1f} us "
        f"({min(times[label]):.1f}-{max(times[label]):.1f}) "
        f"error {error[label]:.3e}, maxima as strip's: {same[label][0]} / {same[label][1]}"
        for label, _ in bound
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    from pyspk.candidate.trunk import TrunkWeights
    from pyspk.candidate.trunk.shapes import TRUNK_BATCH, TrunkSite
    from pyspk.cuda import CudaRuntime, DeviceAttributes
    from pyspk.cuda.manifest import KernelModule
    from pyspk.cuda.math import CudaMath
    from pyspk.cuda.tier import PtxTier

    site = TrunkSite.LAYER1_CONV
    conv = next(c for c in TrunkWeights.random(3).convs() if c.site is site)
    lines = [
        f"# {Path(__file__).name}: layer1's convolution, {DeviceAttributes.query(0).name}, "
        f"batch {TRUNK_BATCH}, {args.rounds} rounds of {args.launches} launches a form, "
        "median (range) us a launch; norm-wise error against float64 on chunks 0 and 1; "
        "chunk maxima as the strip form's at 32 / 11 chunks"
    ]
    with CudaRuntime(0) as runtime:
        loaded = runtime.load_kernels(KernelModule.TRUNK)
        if loaded.tier is not PtxTier.SM90:
            print(f"the sm90 tier is not loaded here ({loaded.tier})", file=sys.stderr)
            return 2
        buffers = _Buffers(runtime, conv)
        time = _timer(runtime)
        for math in CudaMath:
            buffers.use_math(math)
            forms = [_Form("strip", loaded.function(site.kernel(math)), site.launch(), buffers)]
            tiles = loaded.function(site.kernel(math, PtxTier.SM90))
            forms.append(_Form("tiles", tiles, site.launch(math, PtxTier.SM90), buffers))
            for spec in args.variant:
                forms.append(_Form(*_variant_kernel(spec, math), buffers))
            for residual in (False, True):
                for line in _compare(forms, residual, args.rounds, args.launches, time):
                    print(f"{math} {line}", flush=True)
                    lines.append(f"{math} {line}")
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
