"""Plans on the segdense kernels: `Producer` packs weights and prepares every launch
before capture; `DenseOxide` and `SegConvOxide` are the two candidates built on it.

A plan checks, packs and synchronizes once; an enqueue only checks its two buffers,
writes their addresses into launches prepared at plan time and queues them, with no
allocation and no synchronization, so it can be captured in a CUDA graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import numpy as np

from pyspk.candidate.errors import GeometryInvalid, WeightsOutOfContract
from pyspk.candidate.framework import (
    PASS_THROUGH,
    Op,
    Phases,
    Scratch,
    launchable_kernels,
)
from pyspk.candidate.segdense.packing import gather_map, pack_weight
from pyspk.candidate.segdense.selection import SegdensePin
from pyspk.candidate.segdense.shapes import (
    CONTEXT,
    EMBED_MAX_SPLITS,
    HALF_MIN_SPLITS,
    KERNEL_PREFIX,
    TAPS,
    Classifier,
    Config,
    Conv,
    Gemm,
    Gemv,
    Kind,
    Reduction,
    Split,
    SplitWeights,
    TensorConv,
    packs_on_host,
)
from pyspk.cuda import driver
from pyspk.cuda.buffers import DeviceBuffer, buffer_interface, device_address
from pyspk.cuda.errors import (
    BufferLayoutError,
    BufferLengthError,
    ClosedError,
    DriverError,
    InvalidArgument,
)
from pyspk.cuda.kernels import BOUND_STREAMS, buffer_params
from pyspk.cuda.lifetime import PlanLifetime
from pyspk.cuda.manifest import KernelModule
from pyspk.cuda.runtime import free_after_error

if TYPE_CHECKING:
    from pyspk.cuda.kernels import Launch, LoadedKernels
    from pyspk.cuda.runtime import CudaRuntime


# the entries' parameter lists in the calling convention of ptx/src/common/common.cuh (each buffer a
# 64-bit pointer and its 64-bit element count, scalars 32-bit unsigned), named so that
# launches are set by name
CONV_PARAMS = (*buffer_params("x"), *buffer_params("w"), *buffer_params("y"))
DENSE_PARAMS = (
    *buffer_params("x"),
    *buffer_params("w"),
    *buffer_params("bias"),
    *buffer_params("y"),
)
REDUCE_PARAMS = (
    *buffer_params("partials"),
    *buffer_params("bias"),
    *buffer_params("y"),
    ("splits", "u32"),
)
GATHER_PARAMS = (
    *buffer_params("src"),
    *buffer_params("map"),
    *buffer_params("dst"),
    *buffer_params("bad"),
)
GATHER_KERNEL = f"{KERNEL_PREFIX}pack_gather"
_PACK_BLOCK = 1024


# a plan's main launcher and its reduction's (None without split-K), bound to one stream
_Launchers = tuple[Callable[[], None], Callable[[], None] | None]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@attrs.frozen
class _Geometry:
    """The fixed shape a pin's entry serves: rows per item, columns, reduction, batch,
    and the element counts of the input and output buffers."""

    rows: int
    n: int
    k: int
    batch: int
    input_len: int
    output_len: int

    @classmethod
    def of(cls, pin: SegdensePin) -> _Geometry:
        entry = pin.entry()
        site, batch = entry.site(), entry.batch()
        rows, n, k, length = site.dimensions()
        m = batch * rows
        input_len = batch * (k // TAPS) * length if site.is_conv() else m * k
        return cls(rows, n, k, batch, input_len, m * n)


class Producer(PlanLifetime):
    """A packed-weight producer with no library dependency at enqueue time."""

    def __init__(
        self,
        runtime: CudaRuntime,
        pin: SegdensePin,
        main: Launch,
        reduce: Launch | None,
        owned: list[DeviceBuffer],
        input_len: int,
        output_len: int,
    ) -> None:
        # the lock: the launches' parameter blocks are shared, so one enqueue writes its
        # addresses and launches before another thread's may write theirs
        super().__init__(runtime, owned, CONTEXT)
        self.pin = pin
        self.input_len = input_len
        self.output_len = output_len
        self._main = main
        self._reduce = reduce
        self._ordinal = runtime.ordinal
        # bound once: an enqueue writes two addresses and makes the driver calls, and
        # allocates nothing of its own
        stream = runtime.stream
        self._set_input = main.setter("x")
        self._set_output = (main if reduce is None else reduce).setter("y")
        # split-K: the partial planes' length, and where the launches read them now (the
        # plan's own scratch, or the last caller's `partials`)
        self.workspace_len = 0 if reduce is None else reduce.value("partials_len")
        self._own_partials = 0 if reduce is None else reduce.value("partials")
        self._partials_at = self._own_partials
        self._launch_main = main.bind(stream)
        self._launch_reduce = None if reduce is None else reduce.bind(stream)
        # launchers bound to the caller streams seen (PyTorch's current streams), so an
        # enqueue on one pays no new driver handle
        self._stream_launchers: dict[int, _Launchers] = {}
        self._borrowed: Scratch | None = None  # a caller's scratch the partials go to

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
        the convolutions, whose bias the caller's pooling stage adds.

        Every read of the weight and bias comes after the work pending on their
        producer streams, and both are refused unless finite. Where the module's gather
        kernel makes the weight's layout (`gather_map`), it packs the weight on the
        device, flagging any non-finite element; the packs that scale the weight or
        list rows of it read it once to the host and pack it there. The bias is read to
        the host (n floats) and copied."""
        if runtime.closed:
            raise ClosedError(f"{CONTEXT}: the runtime was closed; nothing was planned")
        shape = _check(kernels, bias, pin)
        config = pin.config()
        ordinal, weight_len = runtime.ordinal, shape.n * shape.k
        weight_at = buffer_interface(weight, CONTEXT, "weight", ordinal, expected_len=weight_len)
        bias_at = None
        if bias is not None:
            bias_at = buffer_interface(bias, CONTEXT, "bias", ordinal, expected_len=shape.n)
        on_host = packs_on_host(config.kind)
        biases = None if bias_at is None else runtime.read(*bias_at)
        weights = runtime.read(*weight_at) if on_host else None
        for name, values in (("bias", biases), ("weight", weights)):
            if values is not None:
                _finite(values, name)
        workspace = _workspace(config.kind, shape)
        partials = 0 if scratch is None else _scratch_address(scratch, workspace, runtime.ordinal)
        n, k = shape.n, shape.k
        host: np.ndarray | None = None
        layout: tuple[Kind, int, int, np.ndarray] | None = None
        if on_host:
            assert weights is not None  # read above for the packs made on the host
            host = pack_weight(config.kind, weights, n, k)
        else:
            entries = gather_map(config.kind, n, k)
            assert entries is not None  # None only for the packs made on the host
            layout = (config.kind, n, k, entries)
        owned: list[DeviceBuffer] = []
        flag = None
        try:
            buffers = _buffers(runtime, host, layout, biases, workspace, partials, owned)
            flag = buffers[-1]
            main, reduce = _launches(runtime, kernels, config, shape, weight_at, *buffers)
            # packing may run on another stream than the one a graph later captures
            runtime.synchronize()
            refused = 0 if flag is None else int(runtime.read(flag.ptr, 1, None)[0])
            if refused:
                raise WeightsOutOfContract(
                    CONTEXT,
                    f"the weight holds {refused} non-finite values (found by the device "
                    "pack); plans take finite weights only",
                )
        except BaseException:
            free_after_error(owned)
            raise
        finally:
            if flag is not None:
                flag.free()
        producer = cls(runtime, pin, main, reduce, owned, shape.input_len, shape.output_len)
        if scratch is not None and reduce is not None:
            # the plan writes its partials there: keep the caller's scratch alive with it,
            # and check at every enqueue that it shares no byte with the input or output
            producer._borrowed = scratch
        return producer

    def enqueue(
        self,
        x: object,
        output: object,
        phases: Phases = PASS_THROUGH,
        *,
        stream: int | None = None,
        partials: object | None = None,
    ) -> None:
        """Queues the producer and, for split-K, its fixed-order reduction, on the plan's
        runtime stream, or on `stream` (a raw handle of a stream in the runtime's context,
        e.g. `torch.cuda.current_stream().cuda_stream`; not with `phases`). Checks the
        plan, its runtime and the buffers (their lengths, devices, and that they share
        no byte: no kernel works in place) before launching anything. Safe to call from
        several threads: each call launches with its own buffers.

        A split-K plan writes its partial planes to scratch it owns, so its enqueues must
        not overlap in time (one stream, or graphs replayed one after another);
        `partials` (`workspace_len` floats) gives one call scratch of its own instead,
        e.g. from the caller's stream-ordered allocator."""
        runtime = self.runtime
        self._check_open()
        in_len, out_len = self.input_len, self.output_len
        x_ptr = device_address(x, in_len, CONTEXT, "input", self._ordinal)
        y_ptr = device_address(output, out_len, CONTEXT, "output", self._ordinal, writable=True)
        if x_ptr < y_ptr + 4 * out_len and y_ptr < x_ptr + 4 * in_len:
            raise BufferLayoutError(
                CONTEXT, "output", "shares bytes with input; the kernels do not work in place"
            )
        partials_at = self._own_partials
        if partials is not None:
            partials_at = self._partials_address(partials, x_ptr, y_ptr)
        elif self._borrowed is not None:
            self._check_apart("scratch", partials_at, self.workspace_len, x_ptr, y_ptr)
        if stream is not None and phases is not PASS_THROUGH:
            raise InvalidArgument(f"{CONTEXT}: phases time the runtime stream; give no stream")
        self._acquire()
        try:
            # checked again under the lock that close() takes: a plan closed since the
            # check above launches nothing, and close() frees only after this launch
            self._check_open()
            runtime.note_capture_user(self)
            self._set_input(x_ptr)
            self._set_output(y_ptr)
            if partials_at != self._partials_at:
                self._main.set("y", partials_at)
                self._reduce.set("partials", partials_at)  # type: ignore[union-attr]
                self._partials_at = partials_at
            if stream is None:
                launch_main, launch_reduce = self._launch_main, self._launch_reduce
            else:
                launchers = self._stream_launchers.get(stream) or self._bind_stream(stream)
                launch_main, launch_reduce = launchers
            if phases is PASS_THROUGH:
                launch_main()
                if launch_reduce is not None:
                    launch_reduce()
                return
            phases.op(Op.MAIN, launch_main)
            if launch_reduce is not None:
                phases.op(Op.REDUCE, launch_reduce)
        finally:
            self._release()

    def _partials_address(self, partials: object, x_ptr: int, y_ptr: int) -> int:
        """The checked address of a caller's partials: a split-K plan's only, of
        `workspace_len` floats, sharing no byte with the input or the output."""
        if self._reduce is None:
            raise BufferLayoutError(
                CONTEXT, "partials", "given to a plan without split-K, which has none"
            )
        length = self.workspace_len
        at = device_address(partials, length, CONTEXT, "partials", self._ordinal, writable=True)
        self._check_apart("partials", at, length, x_ptr, y_ptr)
        return at

    def _check_apart(self, buffer: str, at: int, length: int, x_ptr: int, y_ptr: int) -> None:
        """`BufferLayoutError` where `length` floats at `at` share a byte with the input
        or the output."""
        for name, ptr, other_len in (
            ("input", x_ptr, self.input_len),
            ("output", y_ptr, self.output_len),
        ):
            if at < ptr + 4 * other_len and ptr < at + 4 * length:
                raise BufferLayoutError(CONTEXT, buffer, f"overlaps the {name}")

    def _bind_stream(self, stream: int) -> _Launchers:
        if len(self._stream_launchers) >= BOUND_STREAMS:
            self._stream_launchers.clear()
        reduce = self._reduce
        launchers = (self._main.bind(stream), None if reduce is None else reduce.bind(stream))
        self._stream_launchers[stream] = launchers
        return launchers


def _check(kernels: LoadedKernels, bias: object | None, pin: SegdensePin) -> _Geometry:
    """Refuses a module, bias or split count the pin's entry cannot take; the geometry."""
    if kernels.module is not KernelModule.SEGDENSE:
        raise GeometryInvalid(CONTEXT, f"the {kernels.module} module cannot run segdense plans")
    site = pin.entry().site()
    if site.is_conv() and bias is not None:
        raise GeometryInvalid(
            CONTEXT, f"{site.value} takes no bias: the caller's pooling stage adds it"
        )
    if not site.is_conv() and bias is None:
        raise GeometryInvalid(CONTEXT, f"{site.value} needs its bias")
    kind = pin.config().kind
    if isinstance(kind, Split):
        if not 1 <= kind.splits <= EMBED_MAX_SPLITS:
            raise GeometryInvalid(
                CONTEXT,
                f"{kind.splits} split-K slices, the reduction adds 1 to {EMBED_MAX_SPLITS}",
            )
        if kind.weights is SplitWeights.SCALED_HALF and kind.splits < HALF_MIN_SPLITS:
            raise GeometryInvalid(
                CONTEXT,
                f"{kind.splits} split-K slices, the FP16 kernel needs at least {HALF_MIN_SPLITS}",
            )
    return _Geometry.of(pin)


def _workspace(kind: Kind, shape: _Geometry) -> int:
    """Floats of the split-K partial planes (0 without split-K)."""
    return kind.splits * shape.output_len if isinstance(kind, Split) else 0


def _buffers(
    runtime: CudaRuntime,
    host: np.ndarray | None,
    layout: tuple[Kind, int, int, np.ndarray] | None,
    biases: np.ndarray | None,
    workspace: int,
    partials: int,
    owned: list[DeviceBuffer],
) -> tuple[DeviceBuffer, DeviceBuffer | None, int, DeviceBuffer | None, DeviceBuffer | None]:
    """The plan's device buffers, each it keeps added to `owned` as it is made: the
    packed weight (`host` uploaded, or room for the gather of `layout`'s map of the
    kind, n and k), the bias copy, the address of the split-K partial planes
    (`partials`, a caller's checked scratch, or a buffer of the plan's own; 0 without
    split-K); and for a gather its map (kept by the runtime for every plan of the
    layout) and a zeroed flag for non-finite weights, freed after planning."""
    if layout is None:
        assert host is not None  # the caller packs on the host exactly when it has no layout
        weight = runtime.upload(host)
    else:
        weight = runtime.alloc_zeros(layout[3].size)
    owned.append(weight)
    bias = None if biases is None else runtime.upload(biases)
    if bias is not None:
        owned.append(bias)
    if workspace and not partials:
        own = runtime.alloc_zeros(workspace)
        owned.append(own)
        partials = own.ptr
    if layout is None:
        return weight, bias, partials, None, None
    kind, n, k, entries = layout
    table = runtime.constant((GATHER_KERNEL, kind, n, k), lambda: entries.view(np.float32))
    return weight, bias, partials, table, runtime.alloc_zeros(1)


def _launches(
    runtime: CudaRuntime,
    kernels: LoadedKernels,
    config: Config,
    shape: _Geometry,
    source: tuple[int, int, int | None],
    weight: DeviceBuffer,
    bias: DeviceBuffer | None,
    partials: int,
    layout: DeviceBuffer | None,
    flag: DeviceBuffer | None,
) -> tuple[Launch, Launch | None]:
    """Launches the gather of the weight at `source` (pointer, length, producer stream)
    by the map `layout` where there is one, and prepares the main launch and, for
    split-K, the reduction launch, with every parameter but the input and output
    addresses, which each enqueue writes."""
    kind = config.kind
    weights = [weight.ptr, len(weight)]
    reduction = Reduction.shape(kind.splits) if isinstance(kind, Split) else None
    params: tuple[tuple[str, str], ...]
    if isinstance(kind, (Conv, TensorConv)):
        params, values = CONV_PARAMS, [0, shape.input_len, *weights, 0, shape.output_len]
    elif reduction is None:
        assert bias is not None  # `_check` refuses a dense site without its bias
        params = DENSE_PARAMS
        values = [0, shape.input_len, *weights, bias.ptr, shape.n, 0, shape.output_len]
    else:
        assert bias is not None  # `_check` refuses a dense site without its bias
        workspace = _workspace(kind, shape)
        params = DENSE_PARAMS
        values = [0, shape.input_len, *weights, bias.ptr, shape.n, partials, workspace]
        reduce_values = [
            partials,
            workspace,
            bias.ptr,
            shape.n,
            0,
            shape.output_len,
            reduction.splits,
        ]
    grid = _grid(kind, shape)
    names = [config.kernel]
    names += [] if layout is None else [GATHER_KERNEL]
    names += [] if reduction is None else [reduction.kernel]
    functions = launchable_kernels(runtime.device, kernels, names, config.shared)
    main = functions[0]
    if layout is not None and flag is not None:
        runtime.order_after(source[2])  # the gather reads the weight on the runtime's stream
        length = len(weight)
        gather_values = [*source[:2], layout.ptr, length, weight.ptr, length, flag.ptr, 1]
        pack_grid = _ceil_div(length, _PACK_BLOCK)
        functions[1].launch(pack_grid, _PACK_BLOCK, 0, GATHER_PARAMS, gather_values).enqueue(
            runtime.stream
        )
    main_launch = main.launch(grid, config.block, config.shared, params, values)
    if reduction is None:
        return main_launch, None
    reduce = functions[-1].launch(reduction.grid, reduction.block, 0, REDUCE_PARAMS, reduce_values)
    return main_launch, reduce


def _grid(kind: Kind, shape: _Geometry) -> tuple[int, int, int]:
    """The launch grid of each kind: blocks over the output tiles (x, y) and, for
    split-K, the reduction slices (z); the convolutions' y is the batch item."""
    m = shape.batch * shape.rows
    match kind:
        case Conv(positions=positions) | TensorConv(positions=positions):
            return (_ceil_div(shape.rows, positions), shape.batch, 1)
        case Gemm(rows=rows, cols=cols):
            return (_ceil_div(m, rows), shape.n // cols, 1)
        case Classifier(rows=rows):
            return (_ceil_div(m, rows), 1, 1)
        case Gemv(cols=cols):
            return (shape.n // cols, 1, 1)
        case Split(rows=rows, cols=cols, splits=splits):
            return (_ceil_div(m, rows), shape.n // cols, splits)
    raise GeometryInvalid(CONTEXT, f"no grid for kind {kind!r}")


def _scratch_address(scratch: Scratch, workspace: int, ordinal: int) -> int:
    """The checked address of a caller's scratch for `workspace` floats of partial
    planes: at least that long, live, aligned and on device `ordinal`."""
    if len(scratch) < workspace:
        raise BufferLengthError(CONTEXT, workspace, len(scratch), "scratch")
    if isinstance(scratch, DeviceBuffer) and scratch.freed:
        raise BufferLayoutError(CONTEXT, "scratch", "is a DeviceBuffer that was freed")
    ptr = int(scratch.ptr)
    if ptr % 4:
        raise BufferLayoutError(CONTEXT, "scratch", f"address {ptr:#x} is not 4-byte aligned")
    try:
        found = driver.pointer_device_ordinal(ptr)
    except DriverError as error:
        raise BufferLayoutError(
            CONTEXT, "scratch", f"address {ptr:#x} is not CUDA device memory ({error.result_name})"
        ) from error
    if found != ordinal:
        raise BufferLayoutError(
            CONTEXT, "scratch", f"lives on device {found}, expected device {ordinal}"
        )
    return ptr


def _finite(values: np.ndarray, name: str) -> np.ndarray:
    """`values`, or `WeightsOutOfContract` naming the first NaN or infinity: the numerics
    contract bounds outputs by sums of |terms|, which a non-finite operand has none of."""
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        raise WeightsOutOfContract(
            CONTEXT,
            f"the {name} holds {bad.size} non-finite values (the first, {values[bad[0]]}, at "
            f"element {int(bad[0])}); plans take finite weights only",
        )
    return values
