"""Plans on the segdense kernels: `Producer` packs weights and prepares every launch
before capture; `DenseOxide` and `SegConvOxide` are the two candidates built on it.

A plan checks, packs and synchronizes once; an enqueue only checks its two buffers,
writes their addresses into launches prepared at plan time and queues them, with no
allocation and no synchronization, so it can be captured in a CUDA graph."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid
from pyspk.candidate.framework import (
    PASS_THROUGH,
    Coverage,
    DenseSpec,
    Op,
    Phases,
    Scratch,
    SegConvSpec,
    SpecialValues,
)
from pyspk.candidate.segdense.packing import pack_half_columns, selected_rows
from pyspk.candidate.segdense.selection import (
    CONTEXT,
    CONV_PADDED,
    DEFAULT_SHARED,
    DENSE_COVERAGE,
    EMBED_MAX_SPLITS,
    HALF_MIN_SPLITS,
    SEGCONV_COVERAGE,
    SPECIAL_VALUES,
    TAPS,
    Classifier,
    Conv,
    Gemm,
    Gemv,
    Reduction,
    SegdensePin,
    Site,
    Split,
    SplitWeights,
    TensorConv,
)
from pyspk.cuda.kernels import KernelModule
from pyspk.cuda.runtime import device_address, device_array

if TYPE_CHECKING:
    from pyspk.cuda.device import DeviceAttributes
    from pyspk.cuda.kernels import Kernel, LoadedKernels
    from pyspk.cuda.runtime import CudaRuntime, DeviceBuffer
    from pyspk.cuda.tier import PtxTier

# every buffer is a pointer and its element count; reductions add the plane count
_BUFFER = ("ptr", "u64")
_PACK_SIGNATURE = (*_BUFFER, *_BUFFER, "u32", "u32", "u32")
_PACK_BLOCK = 1024


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Producer:
    """A packed-weight producer with no library dependency at enqueue time."""

    def __init__(
        self,
        runtime: CudaRuntime,
        pin: SegdensePin,
        main: Any,
        reduce: Any | None,
        owned: list[DeviceBuffer],
        input_len: int,
        output_len: int,
    ) -> None:
        self.runtime = runtime
        self.pin = pin
        self.input_len = input_len
        self.output_len = output_len
        self._main = main
        self._reduce = reduce
        self._owned = owned
        self._ordinal = runtime.ordinal
        # bound once: an enqueue writes two addresses and makes the driver calls, and
        # allocates nothing of its own
        stream = runtime.stream
        self._set_input = main.setter(0)
        if reduce is None:
            self._set_output = main.setter(len(main.signature) - 2)
        else:
            self._set_output = reduce.setter(4)
        self._launch_main = main.bind(stream)
        self._launch_reduce = None if reduce is None else reduce.bind(stream)

    @classmethod
    def plan(
        cls,
        runtime: CudaRuntime,
        kernels: LoadedKernels,
        weight: object,
        bias: object | None,
        pin: SegdensePin,
        scratch: Scratch | None = None,
    ) -> Producer:
        """Checks, packs the weight and prepares the launches; `bias` is None exactly for
        the convolutions, whose bias the caller's pooling stage adds."""
        if kernels.module is not KernelModule.SEGDENSE:
            raise GeometryInvalid(CONTEXT, f"the {kernels.module} module cannot run segdense plans")
        config = pin.config()
        entry = pin.entry()
        site, batch = entry.site(), entry.batch()
        rows, n, k, input_length = site.dimensions()
        weight_ptr, _ = device_array(weight, n * k, CONTEXT, "weight", runtime.ordinal)
        if site.is_conv() != (bias is None):
            raise GeometryInvalid(
                CONTEXT, f"{site.value} takes a bias exactly when it is not a convolution"
            )
        kind = config.kind
        if isinstance(kind, Split):
            if not 1 <= kind.splits <= EMBED_MAX_SPLITS:
                raise GeometryInvalid(
                    CONTEXT,
                    f"{kind.splits} split-K slices, the reduction adds 1 to {EMBED_MAX_SPLITS}",
                )
            if kind.weights is SplitWeights.SCALED_HALF and kind.splits < HALF_MIN_SPLITS:
                raise GeometryInvalid(
                    CONTEXT,
                    f"{kind.splits} split-K slices, the FP16 kernel needs at least "
                    f"{HALF_MIN_SPLITS}",
                )

        main = kernels.function(config.kernel)
        if config.shared > DEFAULT_SHARED:
            optin = runtime.device.shared_optin_bytes
            if config.shared > optin:
                raise DeviceUnsupported(
                    f"{config.kernel} needs {config.shared} bytes of shared memory, "
                    f"the device allows {optin}"
                )
            main.set_max_dynamic_shared(config.shared)

        owned: list[DeviceBuffer] = []
        packed = _pack(runtime, kernels, kind, weight, weight_ptr, n, k)
        owned.append(packed)
        if bias is None:
            bias_ptr, bias_len = 0, 0
        else:
            device_array(bias, n, CONTEXT, "bias", runtime.ordinal)
            bias_copy = runtime.alloc_zeros(n)
            runtime.copy(bias_copy, bias)
            owned.append(bias_copy)
            bias_ptr, bias_len = bias_copy.ptr, n

        m = batch * rows
        input_len = batch * (k // TAPS) * input_length if site.is_conv() else m * k
        output_len = m * n
        grid = _grid(kind, rows, batch, m, n)
        operands = [0, input_len, packed.ptr, len(packed)]
        if not isinstance(kind, (Conv, TensorConv)):
            operands += [bias_ptr, bias_len]
        reduce = None
        if isinstance(kind, Split):
            workspace = kind.splits * output_len
            partials = _scratch(runtime, scratch, workspace, owned)
            main_launch = main.launch(
                grid, config.block, config.shared, _BUFFER * 4, [*operands, partials, workspace]
            )
            shape = Reduction.shape(kind.splits)
            reduce = kernels.function(shape.kernel).launch(
                shape.grid,
                shape.block,
                0,
                (*_BUFFER * 3, "u32"),
                [partials, workspace, bias_ptr, bias_len, 0, output_len, shape.splits],
            )
        else:
            signature = _BUFFER * (len(operands) // 2 + 1)
            main_launch = main.launch(
                grid, config.block, config.shared, signature, [*operands, 0, output_len]
            )

        # packing may run on another stream than the one a graph later captures
        runtime.synchronize()
        return cls(runtime, pin, main_launch, reduce, owned, input_len, output_len)

    def enqueue(self, x: object, output: object, phases: Phases = PASS_THROUGH) -> None:
        """Queues the producer and, for split-K, its fixed-order reduction, on the plan's
        runtime stream. Checks both buffers before launching anything."""
        self._set_input(device_address(x, self.input_len, CONTEXT, "input", self._ordinal))
        self._set_output(
            device_address(output, self.output_len, CONTEXT, "output", self._ordinal, writable=True)
        )
        if phases is PASS_THROUGH:
            self._launch_main()
            if self._launch_reduce is not None:
                self._launch_reduce()
            return
        phases.op(Op.MAIN, self._launch_main)
        if self._launch_reduce is not None:
            phases.op(Op.REDUCE, self._launch_reduce)

    def close(self) -> None:
        """Frees the packed weight, bias and owned partials (idempotent)."""
        owned, self._owned = self._owned, []
        for buffer in owned:
            buffer.free()


def _grid(kind: object, rows: int, batch: int, m: int, n: int) -> tuple[int, int, int]:
    """The grid `Producer.enqueue` of the reference gives each kind."""
    if isinstance(kind, (Conv, TensorConv)):
        return (_ceil_div(rows, kind.positions), batch, 1)
    if isinstance(kind, Gemm):
        return (_ceil_div(m, kind.rows), n // kind.cols, 1)
    if isinstance(kind, Classifier):
        return (_ceil_div(m, kind.rows), 1, 1)
    if isinstance(kind, Gemv):
        return (n // kind.cols, 1, 1)
    if isinstance(kind, Split):
        return (_ceil_div(m, kind.rows), n // kind.cols, kind.splits)
    raise GeometryInvalid(CONTEXT, f"no grid for kind {kind!r}")


def _scratch(
    runtime: CudaRuntime, scratch: Scratch | None, workspace: int, owned: list[DeviceBuffer]
) -> int:
    """The address of `workspace` floats for the partial planes: the caller's scratch
    (at least that long) or a new buffer this plan owns."""
    if scratch is None:
        buffer = runtime.alloc_zeros(workspace)
        owned.append(buffer)
        return buffer.ptr
    if len(scratch) < workspace:
        raise GeometryInvalid(
            CONTEXT, f"scratch holds {len(scratch)} floats, the partials need {workspace}"
        )
    return scratch.ptr


def _pack_on_device(
    runtime: CudaRuntime,
    pack: Kernel,
    source: int,
    source_len: int,
    length: int,
    dims: tuple[int, int, int],
) -> DeviceBuffer:
    """Runs a pack kernel over a new buffer of `length` floats."""
    packed = runtime.alloc_zeros(length)
    launch = pack.launch(
        _ceil_div(length, _PACK_BLOCK),
        _PACK_BLOCK,
        0,
        _PACK_SIGNATURE,
        [source, source_len, packed.ptr, length, *dims],
    )
    launch.enqueue(runtime.stream)
    return packed


def _pack(
    runtime: CudaRuntime,
    kernels: LoadedKernels,
    kind: object,
    weight: object,
    weight_ptr: int,
    n: int,
    k: int,
) -> DeviceBuffer:
    """The weight in the layout the kind's kernel reads."""
    if isinstance(kind, Conv):
        pack = kernels.function("spk_segdense_pack")
        return _pack_on_device(
            runtime, pack, weight_ptr, n * k, k * CONV_PADDED, (n, k, CONV_PADDED)
        )
    if isinstance(kind, Split) and kind.weights is SplitWeights.SCALED_HALF:
        return runtime.upload(pack_half_columns(runtime.download(weight), n, k))
    if isinstance(kind, Split):
        pack = kernels.function("spk_segdense_pack")
        return _pack_on_device(runtime, pack, weight_ptr, n * k, k * n, (n, k, n))
    if isinstance(kind, TensorConv):
        pack = kernels.function("spk_segdense_pack_conv_mma")
        length = kind.planes * kind.cin_pad * TAPS * CONV_PADDED
        return _pack_on_device(
            runtime, pack, weight_ptr, n * k, length, (k // TAPS, kind.cin_pad, kind.planes)
        )
    if isinstance(kind, Gemm) and kind.select > 0:
        host = runtime.download(weight)
        rows = selected_rows(host, n, kind.select)
        return runtime.upload(np.concatenate([host, rows.view(np.float32)]))
    copy = runtime.alloc_zeros(n * k)
    runtime.copy(copy, weight)
    return copy


class _Oxide:
    """What both candidates share: the pin the rule gives a spec, and a producer's
    enqueue and close."""

    SPECIAL_VALUES: ClassVar[SpecialValues] = SPECIAL_VALUES

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        # one call layer less on the hot path
        self.enqueue = producer.enqueue  # type: ignore[method-assign]

    @classmethod
    def implemented_pin(
        cls, spec: DenseSpec | SegConvSpec, tier: PtxTier, device: DeviceAttributes
    ) -> SegdensePin:
        return SegdensePin.select(Site.of(spec.site()), spec.batch(), spec.math(), tier, device)

    def enqueue(self, x: object, output: object, phases: Phases = PASS_THROUGH) -> None:
        self.producer.enqueue(x, output, phases)

    def close(self) -> None:
        self.producer.close()


class DenseOxide(_Oxide):
    """Segmentation linear0, linear1 and classifier, and embedding seg_1, with their
    bias, LeakyReLU or log-softmax epilogues fused."""

    COVERAGE: ClassVar[Coverage] = DENSE_COVERAGE

    @classmethod
    def plan(
        cls,
        runtime: CudaRuntime,
        kernels: LoadedKernels,
        spec: DenseSpec,
        weight: object,
        bias: object,
        pin: SegdensePin,
        scratch: Scratch | None = None,
    ) -> DenseOxide:
        pin.check(Site.of(spec.site()), spec.batch(), spec.math(), kernels.tier)
        return cls(Producer.plan(runtime, kernels, weight, bias, pin, scratch))


class SegConvOxide(_Oxide):
    """The two raw segmentation convolutions; the caller's pooling stage adds the bias."""

    COVERAGE: ClassVar[Coverage] = SEGCONV_COVERAGE

    @classmethod
    def plan(
        cls,
        runtime: CudaRuntime,
        kernels: LoadedKernels,
        spec: SegConvSpec,
        weight: object,
        pin: SegdensePin,
    ) -> SegConvOxide:
        pin.check(Site.of(spec.site()), spec.batch(), spec.math(), kernels.tier)
        return cls(Producer.plan(runtime, kernels, weight, None, pin))
