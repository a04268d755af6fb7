"""Plans on the segdense kernels: `Producer` packs weights and prepares every launch
before capture; `DenseOxide` and `SegConvOxide` are the two candidates built on it.

A plan checks, packs and synchronizes once; an enqueue only checks its two buffers,
writes their addresses into launches prepared at plan time and queues them, with no
allocation and no synchronization, so it can be captured in a CUDA graph."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import attrs
import numpy as np

from pyspk.candidate.errors import DeviceUnsupported, GeometryInvalid, WeightsOutOfContract
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
from pyspk.candidate.segdense.packing import (
    pack_conv_half,
    pack_conv_rows,
    pack_gemm_half,
    pack_gemm_mma,
    pack_half_columns,
    selected_rows,
)
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
    Config,
    Conv,
    Fragments,
    Gemm,
    Gemv,
    Kind,
    Reduction,
    SegdensePin,
    Site,
    Split,
    SplitWeights,
    TensorConv,
)
from pyspk.cuda import driver
from pyspk.cuda.errors import (
    BufferLengthError,
    ClosedError,
    DriverError,
    InvalidArgument,
    KernelMissingError,
)
from pyspk.cuda.kernels import KernelModule
from pyspk.cuda.runtime import (
    BufferLayoutError,
    DeviceBuffer,
    device_address,
    device_array,
    free_after_error,
    producer_stream,
)

if TYPE_CHECKING:
    from pyspk.cuda.device import DeviceAttributes
    from pyspk.cuda.kernels import Kernel, Launch, LoadedKernels
    from pyspk.cuda.runtime import CudaRuntime
    from pyspk.cuda.tier import PtxTier


def _buffer(name: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """A buffer parameter of the calling convention: its pointer and element count."""
    return ((name, "ptr"), (f"{name}_len", "u64"))


# the parameter lists of DESIGN.md section 4, named so that launches are set by name
CONV_PARAMS = (*_buffer("x"), *_buffer("w"), *_buffer("y"))
DENSE_PARAMS = (*_buffer("x"), *_buffer("w"), *_buffer("bias"), *_buffer("y"))
REDUCE_PARAMS = (*_buffer("partials"), *_buffer("bias"), *_buffer("y"), ("splits", "u32"))
PACK_PARAMS = (*_buffer("src"), *_buffer("dst"), ("d0", "u32"), ("d1", "u32"), ("d2", "u32"))
_PACK_BLOCK = 1024


# caller streams a plan keeps launchers bound to; past this many it starts afresh
_BOUND_STREAMS = 16
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


class Producer:
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
        self.runtime = runtime
        self.pin = pin
        self.input_len = input_len
        self.output_len = output_len
        self._main = main
        self._reduce = reduce
        self._owned = owned
        self._ordinal = runtime.ordinal
        self._closed = False
        self._graphs = 0  # live captured graphs that launch this plan
        # the launches' parameter blocks are shared: one enqueue writes its addresses and
        # launches before another thread's may write theirs
        lock = threading.Lock()
        self._acquire, self._release = lock.acquire, lock.release
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
        the convolutions, whose bias the caller's pooling stage adds."""
        if runtime.closed:
            raise ClosedError(f"{CONTEXT}: the runtime was closed; nothing was planned")
        shape, weight_ptr = _check(runtime, kernels, weight, bias, pin)
        # every plan-time read (the pack, on the device or through a download, and the
        # bias copy) is ordered after the work that writes the weight and the bias
        for name, operand in (("weight", weight), ("bias", bias)):
            if operand is not None:
                runtime.order_after(producer_stream(operand, CONTEXT, name, runtime.ordinal))
        config = pin.config()
        main = _main_kernel(runtime, kernels, config)
        owned: list[DeviceBuffer] = []
        try:
            packed = _pack(runtime, kernels, config.kind, weight, weight_ptr, shape.n, shape.k)
            owned.append(packed)
            bias_copy = _copy_bias(runtime, bias, shape.n)
            if bias_copy is not None:
                owned.append(bias_copy)
            main_launch, reduce = _launches(
                runtime, kernels, config, shape, main, packed, bias_copy, scratch, owned
            )
            # packing may run on another stream than the one a graph later captures
            runtime.synchronize()
        except BaseException:
            free_after_error(owned)
            raise
        producer = cls(runtime, pin, main_launch, reduce, owned, shape.input_len, shape.output_len)
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
        if self._closed or runtime._closed:
            what = "plan" if self._closed else "runtime of this plan"
            raise ClosedError(f"{CONTEXT}: the {what} was closed; nothing was launched")
        # a live buffer of this runtime and the right length needs no other check (the
        # runtime is open, so its allocations are); anything else takes device_address
        in_len, out_len = self.input_len, self.output_len
        if type(x) is DeviceBuffer and x._runtime is runtime and x._len == in_len and x._live:
            x_ptr = x._ptr
        else:
            x_ptr = device_address(x, in_len, CONTEXT, "input", self._ordinal)
        if (
            type(output) is DeviceBuffer
            and output._runtime is runtime
            and output._len == out_len
            and output._live
        ):
            y_ptr = output._ptr
        else:
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
            if self._closed or runtime._closed:
                what = "plan" if self._closed else "runtime of this plan"
                raise ClosedError(f"{CONTEXT}: the {what} was closed; nothing was launched")
            if runtime._capturing:
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
        if len(self._stream_launchers) >= _BOUND_STREAMS:
            self._stream_launchers.clear()
        reduce = self._reduce
        launchers = (self._main.bind(stream), None if reduce is None else reduce.bind(stream))
        self._stream_launchers[stream] = launchers
        return launchers

    def close(self) -> None:
        """Refuses every later enqueue and frees the packed weight, bias and owned
        partials (idempotent). While a captured graph that launches this plan is alive,
        the free waits for the last such graph to be closed or collected."""
        self._acquire()  # waits for an enqueue in flight, which launched on live memory
        try:
            self._closed = True
            owned = self._take_owned() if self._graphs == 0 else []
        finally:
            self._release()
        _free_all(owned)

    def graph_opened(self) -> None:
        self._acquire()
        try:
            self._graphs += 1
        finally:
            self._release()

    def graph_closed(self) -> None:
        # also called from the collector's finalizers, on any thread
        self._acquire()
        try:
            self._graphs -= 1
            owned = self._take_owned() if self._closed and self._graphs == 0 else []
        finally:
            self._release()
        _free_all(owned)

    def _take_owned(self) -> list[DeviceBuffer]:
        """The buffers to free, taken once (under the lock)."""
        owned, self._owned = self._owned, []
        return owned


def _free_all(buffers: list[DeviceBuffer]) -> None:
    """Frees every buffer; the first error is raised after the others are freed."""
    failure: BaseException | None = None
    for buffer in buffers:
        try:
            buffer.free()
        except Exception as error:
            failure = failure or error
    if failure is not None:
        raise failure


def _check(
    runtime: CudaRuntime,
    kernels: LoadedKernels,
    weight: object,
    bias: object | None,
    pin: SegdensePin,
) -> tuple[_Geometry, int]:
    """Refuses a module, weight, bias or split count the pin's entry cannot take; the
    geometry and the weight's device address."""
    if kernels.module is not KernelModule.SEGDENSE:
        raise GeometryInvalid(CONTEXT, f"the {kernels.module} module cannot run segdense plans")
    shape = _Geometry.of(pin)
    site = pin.entry().site()
    weight_ptr, _ = device_array(weight, shape.n * shape.k, CONTEXT, "weight", runtime.ordinal)
    if site.is_conv() != (bias is None):
        raise GeometryInvalid(
            CONTEXT, f"{site.value} takes a bias exactly when it is not a convolution"
        )
    if bias is not None:
        device_array(bias, shape.n, CONTEXT, "bias", runtime.ordinal)
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
    return shape, weight_ptr


def _function(kernels: LoadedKernels, name: str) -> Kernel:
    """An entry of the loaded module; one it does not carry means this kernel cannot
    serve here, a `DeviceUnsupported` an engine falls back on."""
    try:
        return kernels.function(name)
    except KernelMissingError as error:
        raise DeviceUnsupported(f"{name} cannot run here: {error}; use the library") from error


def _main_kernel(runtime: CudaRuntime, kernels: LoadedKernels, config: Config) -> Kernel:
    """The entry, opted in to its dynamic shared memory where that is above the default."""
    main = _function(kernels, config.kernel)
    if config.shared > DEFAULT_SHARED:
        optin = runtime.device.shared_optin_bytes
        if config.shared > optin:
            raise DeviceUnsupported(
                f"{config.kernel} needs {config.shared} bytes of shared memory, "
                f"the device allows {optin}"
            )
        main.set_max_dynamic_shared(config.shared)
    return main


def _copy_bias(runtime: CudaRuntime, bias: object | None, n: int) -> DeviceBuffer | None:
    """The plan's own copy of the bias (None for the convolutions); non-finite values
    are refused."""
    if bias is None:
        return None
    return runtime.upload(_finite(runtime.download(bias), "bias"))


def _launches(
    runtime: CudaRuntime,
    kernels: LoadedKernels,
    config: Config,
    shape: _Geometry,
    main: Kernel,
    packed: DeviceBuffer,
    bias: DeviceBuffer | None,
    scratch: Scratch | None,
    owned: list[DeviceBuffer],
) -> tuple[Launch, Launch | None]:
    """The main launch and, for split-K, the reduction launch, with every parameter but
    the input and output addresses, which each enqueue writes."""
    kind = config.kind
    grid = _grid(kind, shape)
    weight = [packed.ptr, len(packed)]
    if isinstance(kind, (Conv, TensorConv)):
        values = [0, shape.input_len, *weight, 0, shape.output_len]
        return main.launch(grid, config.block, config.shared, CONV_PARAMS, values), None
    assert bias is not None  # _check pairs a bias with every dense site
    operands = [0, shape.input_len, *weight, bias.ptr, shape.n]
    if not isinstance(kind, Split):
        values = [*operands, 0, shape.output_len]
        return main.launch(grid, config.block, config.shared, DENSE_PARAMS, values), None
    workspace = kind.splits * shape.output_len
    partials = _scratch(runtime, scratch, workspace, owned)
    values = [*operands, partials, workspace]
    main_launch = main.launch(grid, config.block, config.shared, DENSE_PARAMS, values)
    reduction = Reduction.shape(kind.splits)
    reduce_values = [partials, workspace, bias.ptr, shape.n, 0, shape.output_len, reduction.splits]
    reduce = _function(kernels, reduction.kernel).launch(
        reduction.grid, reduction.block, 0, REDUCE_PARAMS, reduce_values
    )
    return main_launch, reduce


def _grid(kind: Kind, shape: _Geometry) -> tuple[int, int, int]:
    """The grid `Producer.enqueue` of the reference gives each kind."""
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
    if found != runtime.ordinal:
        raise BufferLayoutError(
            CONTEXT, "scratch", f"lives on device {found}, expected device {runtime.ordinal}"
        )
    return ptr


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
        PACK_PARAMS,
        [source, source_len, packed.ptr, length, *dims],
    )
    launch.enqueue(runtime.stream)
    return packed


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


def _pack(
    runtime: CudaRuntime,
    kernels: LoadedKernels,
    kind: Kind,
    weight: object,
    source: int,
    n: int,
    k: int,
) -> DeviceBuffer:
    """The weight (checked, at device address `source`) in the layout the kind's kernel
    reads, in a buffer the plan owns; non-finite weights are refused first."""
    host = _finite(runtime.download(weight), "weight")
    match kind:
        case Conv():
            return runtime.upload(pack_conv_rows(host, k // TAPS))
        case TensorConv(cin_pad=cin_pad, planes=1):
            return runtime.upload(pack_conv_half(host, k // TAPS, cin_pad))
        case TensorConv(cin_pad=cin_pad, planes=planes):
            pack = _function(kernels, "spk_segdense_pack_conv_mma")
            length = planes * cin_pad * TAPS * CONV_PADDED
            dims = (k // TAPS, cin_pad, planes)
            return _pack_on_device(runtime, pack, source, n * k, length, dims)
        case Split(weights=SplitWeights.SCALED_HALF):
            return runtime.upload(pack_half_columns(host, n, k))
        case Split(cols=cols, fragments=Fragments(planes=planes, paired=paired)):
            by_k = host.reshape(n, k).T
            return runtime.upload(pack_gemm_mma(by_k, n, k, cols, planes, paired))
        case Split():
            pack = _function(kernels, "spk_segdense_pack")
            return _pack_on_device(runtime, pack, source, n * k, k * n, (n, k, n))
        case Gemm(cols=cols, select=select, fragments=Fragments() as fragments):
            host = host.reshape(k, n)
            rows = selected_rows(host, n, select) if select else np.zeros(0, np.uint32)
            if fragments.half:
                # the selected rows pack as zeros: the kernel multiplies them in 3xTF32
                packed = pack_gemm_half(host, n, k, cols, rows)
            else:
                packed = pack_gemm_mma(host, n, k, cols, fragments.planes, fragments.paired)
            if select == 0:
                return runtime.upload(packed)
            tail = [rows.view(np.float32), host[rows].ravel()]
            return runtime.upload(np.concatenate([packed, *tail]))
    copy = runtime.alloc_zeros(n * k)
    runtime.copy(copy, weight)
    return copy


class _Oxide:
    """What both candidates share: the pin the rule gives a spec, and a producer's
    enqueue and close."""

    SPECIAL_VALUES: ClassVar[SpecialValues] = SPECIAL_VALUES

    enqueue: Callable[..., None]
    """`Producer.enqueue` of this plan's producer, bound: one call layer less on the hot
    path."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.enqueue = producer.enqueue

    @classmethod
    def implemented_pin(
        cls, spec: DenseSpec | SegConvSpec, tier: PtxTier, device: DeviceAttributes
    ) -> SegdensePin:
        return SegdensePin.select(Site.of(spec.site()), spec.batch(), spec.math(), tier, device)

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
