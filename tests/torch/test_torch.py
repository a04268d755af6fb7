"""`pyspk.torch` and `pyspk.pyannote` checks that need PyTorch (and pyannote.audio) but
no GPU: modules of the wrong shape or device are refused before anything is planned, and
the once-per-chunk embedding path gives the stock pipeline's embeddings on the CPU.
Skipped where PyTorch or pyannote.audio is not installed (the `torch` and `pyannote`
extras)."""

from __future__ import annotations

import contextlib
import os
import types
import warnings

import numpy as np
import pytest

from pyspk.candidate import DenseSite, SegConvSite
from pyspk.errors import GeometryInvalid
from tests.optional import importorskip

torch = pytest.importorskip("torch")
ptorch = pytest.importorskip("pyspk.torch")


def test_a_linear_of_another_shape_is_refused() -> None:
    with pytest.raises(GeometryInvalid, match=r"linear0 is Linear\(256, 128\), not Linear"):
        ptorch.PlannedDense(torch.nn.Linear(128, 128), DenseSite.LINEAR0)
    with pytest.raises(GeometryInvalid, match="takes a bias"):
        ptorch.PlannedDense(torch.nn.Linear(5120, 256, bias=False), DenseSite.EMBEDDING)


def test_a_conv_other_than_valid_five_taps_is_refused() -> None:
    with pytest.raises(GeometryInvalid, match="stride 1"):
        ptorch.PlannedConv1d(torch.nn.Conv1d(80, 60, 5, padding=2), SegConvSite.CONV1)
    with pytest.raises(GeometryInvalid, match="stride 1"):
        ptorch.PlannedConv1d(torch.nn.Conv1d(80, 60, 5), SegConvSite.CONV2)
    with pytest.raises(ValueError, match="'add' or 'drop'"):
        ptorch.PlannedConv1d(torch.nn.Conv1d(60, 60, 5), SegConvSite.CONV2, bias="keep")


def test_a_module_off_the_gpu_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="move the module to a CUDA device"):
        ptorch.PlannedDense(torch.nn.Linear(256, 128), DenseSite.LINEAR0)
    with pytest.raises(ValueError, match="CUDA devices, not cpu"):
        ptorch.shared_runtime(torch.device("cpu"))


def test_a_planned_trunk_takes_one_to_four_streams_on_a_cuda_model() -> None:
    from pyspk.torch.resnet import PlannedTrunk

    class Trunk(torch.nn.Conv2d):
        def forward_frames(self, fbank):
            return fbank

    with pytest.raises(ValueError, match="streams must be 1 to 4, not 5"):
        PlannedTrunk(Trunk(1, 32, 3), streams=5)
    with pytest.raises(ValueError, match="piece must be 1 to 32, not 33"):
        PlannedTrunk(Trunk(1, 32, 3), piece=33)
    with pytest.raises(ValueError, match="on cpu, not a CUDA device"):
        PlannedTrunk(Trunk(1, 32, 3))


@pytest.fixture(scope="module")
def pyannote():
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    importorskip("pyannote.audio")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pyspk.pyannote

    return pyspk.pyannote


def test_accelerate_refuses_a_cpu_model_and_other_models(pyannote) -> None:
    with pytest.raises(ValueError, match="move it to a CUDA device"):
        pyannote.accelerate(pyannote.wespeaker_resnet34(seed=0))
    with pytest.raises(TypeError, match="PyanNet or a WeSpeaker ResNet"):
        pyannote.accelerate(torch.nn.Linear(2, 2))


def test_once_per_chunk_embeddings_equal_the_stock_pipelines(pyannote) -> None:
    """On the CPU (stock seg_1 in both): the trunk once per chunk and the three masks
    pooled together give the per-pair path's embeddings, with and without overlap
    exclusion; `undo` restores the stock method."""
    from pyannote.core import SlidingWindowFeature

    pipeline = pyannote.offline_pipeline(
        pyannote.segmentation_3_0(seed=0), pyannote.wespeaker_resnet34(seed=1), batch_size=8
    )
    audio = {"waveform": 0.1 * torch.randn(1, 16000 * 12), "sample_rate": 16000}
    segmentations = pipeline.get_segmentations(audio)
    rng = np.random.default_rng(0)
    masks = (rng.random(segmentations.data.shape) > 0.6).astype(np.float32)
    masks[1, :, 2] = 0.0  # a speaker absent from a chunk
    binary = SlidingWindowFeature(masks, segmentations.sliding_window)
    for exclude_overlap in (False, True):
        stock = pipeline.get_embeddings(audio, binary, exclude_overlap=exclude_overlap)
        chunked = pyannote.embed_once_per_chunk(pipeline, batch_size=2)
        assert pipeline.get_embeddings.__self__ is chunked
        ours = pipeline.get_embeddings(audio, binary, exclude_overlap=exclude_overlap)
        chunked.undo()
        assert "get_embeddings" not in pipeline.__dict__
        assert ours.shape == stock.shape == (masks.shape[0], 3, 256)
        np.testing.assert_array_equal(np.isnan(ours), np.isnan(stock))
        # float32 sums over other batch compositions: rounding only
        scale = np.nanmax(np.abs(stock))
        assert np.nanmax(np.abs(ours - stock)) <= 1e-5 * scale


# -- the wrappers' own logic, with the plans faked (no GPU) ----------------------------


class _FakePlan:
    """Records each enqueue and writes the library's result, so the wrapper's output can
    be checked; `workspace_len` as a split-K plan of the entry would have."""

    def __init__(self, entry: str, workspace: int, library) -> None:
        self.producer = types.SimpleNamespace(
            pin=types.SimpleNamespace(entry=lambda: types.SimpleNamespace(name=entry)),
            workspace_len=workspace,
        )
        self.library = library
        self.calls: list[dict] = []
        self.closed = False

    def enqueue(self, x, output, *, stream, partials) -> None:
        assert not self.closed
        self.calls.append({"stream": stream, "partials": partials, "shape": tuple(x.shape)})
        output.copy_(self.library(x).reshape(output.shape))

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def faked(monkeypatch: pytest.MonkeyPatch) -> list[_FakePlan]:
    """pyspk.torch on CPU tensors: device 0, stream 0x5EED, and plans that record."""
    plans: list[_FakePlan] = []

    def plan(self, runtime, batch, weight, bias):
        workspace = 66 * 96 * 256 if (self.site, batch) == (DenseSite.EMBEDDING, 32) else 0
        made = _FakePlan(f"{self.site.name}_B{batch}", workspace, self.library)
        plans.append(made)
        return made

    monkeypatch.setattr(ptorch._Planned, "_weight_ordinal", lambda self: 0)
    monkeypatch.setattr(ptorch._Planned, "_plan", plan)
    monkeypatch.setattr(ptorch, "shared_runtime", lambda ordinal: None)
    monkeypatch.setattr(ptorch, "_current_raw_stream", lambda ordinal: 0x5EED)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda ordinal: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda *_: types.SimpleNamespace(synchronize=lambda: None)
    )
    return plans


def test_calls_a_plan_serves_go_to_it_on_the_current_stream(faked) -> None:
    linear = torch.nn.Linear(5120, 256)
    planned = ptorch.PlannedDense(linear, DenseSite.EMBEDDING, name="resnet.seg_1")
    b1, b32 = faked
    with torch.inference_mode():
        y = planned(torch.randn(32, 3, 5120))  # 96 rows: the batch-32 plan
        planned(torch.randn(3, 5120))  # 3 rows: batch 1
        z = planned(torch.randn(2, 3, 5120))  # 6 rows: no plan
    assert y.shape == (32, 3, 256) and z.shape == (2, 3, 256)
    assert [c["shape"] for c in b32.calls] == [(32, 3, 5120)]
    assert [c["shape"] for c in b1.calls] == [(3, 5120)]
    assert b32.calls[0]["stream"] == 0x5EED
    # split-K partials come from PyTorch; the batch-1 plan takes none
    assert b32.calls[0]["partials"].numel() == b32.producer.workspace_len
    assert b1.calls[0]["partials"] is None
    assert planned.entries() == {1: "EMBEDDING_B1", 32: "EMBEDDING_B32"}


def test_multiples_of_32_run_as_batch_32_pieces_in_order(faked) -> None:
    linear = torch.nn.Linear(5120, 256)
    planned = ptorch.PlannedDense(linear, DenseSite.EMBEDDING)
    conv = torch.nn.Conv1d(80, 60, 5)
    planned_conv = ptorch.PlannedConv1d(conv, SegConvSite.CONV1, bias="drop")
    b32, conv32 = faked[1], faked[3]
    with torch.inference_mode():
        x = torch.randn(128, 3, 5120)
        y = planned(x)
        rows = planned(x.reshape(384, 5120))  # the same rows without the item dimension
        other = planned(torch.randn(40, 3, 5120))  # 120 rows: no plan, the library path
        waves = torch.randn(64, 80, 5325)
        z = planned_conv(waves)
        torch.testing.assert_close(y, linear(x))
        torch.testing.assert_close(rows, linear(x).reshape(384, 256))
        torch.testing.assert_close(z, torch.nn.functional.conv1d(waves, conv.weight))
    assert other.shape == (40, 3, 256)
    assert [c["shape"] for c in b32.calls] == [(32, 3, 5120)] * 4 + [(96, 5120)] * 4
    # one split-K scratch serves the pieces, which run in order on the stream
    assert len({id(c["partials"]) for c in b32.calls}) == 1
    assert [c["shape"] for c in conv32.calls] == [(32, 80, 5325)] * 2


def test_split_k_partials_are_kept_per_stream_and_new_while_capturing(
    faked, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = ptorch.PlannedDense(torch.nn.Linear(5120, 256), DenseSite.EMBEDDING)
    b32 = faked[1]
    x = torch.randn(32, 3, 5120)
    stream = [0x5EED]
    monkeypatch.setattr(ptorch, "_current_raw_stream", lambda ordinal: stream[0])
    with torch.inference_mode():
        planned(x)
        planned(x)  # the same stream: the same scratch, in that stream's order
        stream[0] = 0xBEEF
        planned(x)  # another stream: scratch of its own
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        planned(x)
        planned(x)  # captured: new scratch each time, from the graph's pool
    used = [call["partials"] for call in b32.calls]
    assert used[0] is used[1]
    assert len({id(p) for p in used[1:]}) == 4
    planned.close()
    assert not planned._stream_partials


def test_refusals_apply_only_where_a_plan_serves(faked) -> None:
    linear = torch.nn.Linear(256, 128)
    planned = ptorch.PlannedDense(linear, DenseSite.LINEAR0, name="linear.0")
    served, unserved = torch.randn(1, 589, 256), torch.randn(2, 589, 256)
    with pytest.raises(ptorch.InferenceOnlyError, match=r"linear0 \(linear\.0\)"):
        planned(served)
    assert planned(unserved).requires_grad  # the library path records as the module does
    with torch.no_grad():
        linear.weight.mul_(2.0)  # an in-place update
        with pytest.raises(ptorch.WeightsChangedError, match="replan"):
            planned(served)
        planned(unserved)  # the library path reads the current weights
    planned.replan()
    assert all(plan.closed for plan in faked[:2]) and len(faked) == 4
    with torch.no_grad():
        planned(served)
        linear.weight = torch.nn.Parameter(linear.weight.detach().clone())
        planned.weight = linear.weight  # a new Parameter object, same storage values
        with pytest.raises(ptorch.WeightsChangedError):
            planned(served)


def test_close_leaves_the_library_path(faked) -> None:
    planned = ptorch.PlannedDense(torch.nn.Linear(128, 7), DenseSite.CLASSIFIER)
    planned.close()
    x = torch.randn(1, 589, 128)
    with torch.inference_mode():
        assert torch.equal(planned(x), planned.library(x))
    assert all(not plan.calls for plan in faked)


def test_epilogues_are_the_models_activations() -> None:
    y = torch.tensor([-2.0, 0.5])
    assert torch.equal(ptorch.epilogue(DenseSite.LINEAR0)(y), torch.tensor([-0.02, 0.5]))
    assert torch.allclose(ptorch.epilogue(DenseSite.CLASSIFIER)(y), torch.log_softmax(y, -1))
    assert ptorch.epilogue(DenseSite.EMBEDDING) is None


def test_a_half_or_double_module_is_a_fallback_not_an_abort(faked) -> None:
    from pyspk.errors import GeometryUnimplemented, PlanError

    for dtype in (torch.float16, torch.float64):
        linear = torch.nn.Linear(256, 128).to(dtype)
        with pytest.raises(GeometryUnimplemented, match=f"the weight is {dtype}") as refused:
            ptorch.PlannedDense(linear, DenseSite.LINEAR0)
        assert isinstance(refused.value, PlanError)  # the library path serves it
    assert faked == []  # nothing was planned


def test_accelerate_keeps_the_library_path_of_a_half_model(faked, pyannote) -> None:
    model = pyannote.segmentation_3_0(seed=0).half()
    acceleration = pyannote.Acceleration(model, "fp32")
    pyannote._accelerate_pyannet(model, acceleration)
    assert acceleration.modules == {}
    assert set(acceleration.skipped) == {
        "sincnet.conv1d.0",
        "sincnet.conv1d.1",
        "sincnet.conv1d.2",
        "linear.0",
        "linear.1",
        "classifier",
    }
    assert all("float16" in why for why in acceleration.skipped.values())
    acceleration.undo()


def test_the_stats_pool_wrapper_takes_only_pyannotes_tstp(pyannote) -> None:
    from pyspk.errors import GeometryUnimplemented, PlanError
    from pyspk.torch.resnet import PlannedStatsPool

    with pytest.raises(GeometryUnimplemented, match="the pool is a Linear, not TSTP") as refused:
        PlannedStatsPool(torch.nn.Linear(2, 2))
    assert isinstance(refused.value, PlanError)  # accelerate keeps the library's pool


def test_an_fbank_the_kernels_do_not_take_stays_the_librarys(pyannote) -> None:
    """64 mel bins (the kernels take 80): `planned_fbank` gives `Fbank`, no error."""
    from pyannote.audio.models.embedding.wespeaker import WeSpeakerResNet34

    from pyspk.errors import GeometryUnimplemented
    from pyspk.pyannote.fbank import Fbank, PlannedFbank, planned_fbank

    model = WeSpeakerResNet34(num_mel_bins=64)
    with pytest.raises(GeometryUnimplemented, match="64 mel bins"):
        PlannedFbank(model, torch.device("cpu"))
    fbank = planned_fbank(model, torch.device("cpu"))
    assert type(fbank) is Fbank


def test_the_fp32_sinc_front_leaves_other_segmentation_models_alone(pyannote) -> None:
    """The FP32 pipeline's lone planned stage needs a PyanNet's SincNet; another
    segmentation model is recorded as skipped and left as it is."""
    from pyspk.cuda import CudaMath

    model = torch.nn.Linear(4, 4)
    acceleration = pyannote._library_bits_sinc_front(model, CudaMath.FP32, [32], 160000)
    assert acceleration.modules == {}
    assert acceleration.skipped == {"sincnet.conv1d.0": "Linear is not a PyanNet"}


def test_a_call_whose_plan_is_closed_under_it_takes_the_library_path(faked) -> None:
    from pyspk.errors import ClosedError

    linear = torch.nn.Linear(128, 128)
    planned = ptorch.PlannedDense(linear, DenseSite.LINEAR1)

    def closed_meanwhile(*args, **kwargs):
        raise ClosedError("segdense: the plan was closed; nothing was launched")

    for plan in faked:
        plan.enqueue = closed_meanwhile
    x = torch.randn(589, 128)
    with torch.inference_mode():
        torch.testing.assert_close(planned(x), planned.library(x), rtol=0, atol=0)


def test_writes_through_data_keep_the_planned_weights_until_replan(faked) -> None:
    """The documented contract: `.data` writes bypass the version counter, so the plans
    keep what they copied until `replan()`; a tracked in-place write is refused."""
    linear = torch.nn.Linear(128, 128)
    planned = ptorch.PlannedDense(linear, DenseSite.LINEAR1)
    copied = [plan.library for plan in faked]
    x = torch.randn(589, 128)
    with torch.inference_mode():
        before = planned(x)
        linear.weight.data.add_(1.0)
        assert len(faked) == 2  # not re-planned behind the caller's back
        assert planned._state() == planned._planned_state  # nothing the check can see
        planned.replan()
        assert len(faked) == 4 and all(plan.closed for plan in faked[:2])
        after = planned(x)
    assert copied and not torch.equal(before, after)
    with torch.no_grad():
        linear.weight.add_(1.0)  # a tracked write: its version counter moves
    with torch.inference_mode(), pytest.raises(ptorch.WeightsChangedError):
        planned(x)


def test_math_scopes_in_two_threads_never_share_the_switches():
    """A TF32 scope on one thread and FP32 scopes on another, over and over: every FP32
    scope sees TF32 off from start to end, every TF32 scope on, and the process's
    switches are as they were once both threads are done."""
    import threading
    import time

    from pyspk.cuda import CudaMath

    switches = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(switch.allow_tf32 for switch in switches)
    seen: dict[CudaMath, set] = {CudaMath.FP32: set(), CudaMath.TF32: set()}

    def scopes(math: CudaMath) -> None:
        for _ in range(100):
            with ptorch.library_math(math):
                for _ in range(5):
                    seen[math].add(tuple(switch.allow_tf32 for switch in switches))
                    time.sleep(0.0002)  # the other thread runs meanwhile

    threads = [threading.Thread(target=scopes, args=(math,)) for math in CudaMath]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {CudaMath.FP32: {(False, False)}, CudaMath.TF32: {(True, True)}}
    assert tuple(switch.allow_tf32 for switch in switches) == before


def test_scopes_of_one_math_run_together_and_the_other_math_waits():
    """Two FP32 scopes in two threads are open at once (a barrier inside each would
    time out otherwise); a TF32 scope asked for meanwhile opens only after both ended,
    and sees TF32 on; the switches are restored after the last."""
    import threading

    from pyspk.cuda import CudaMath

    switches = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(switch.allow_tf32 for switch in switches)
    both_inside = threading.Barrier(2, timeout=5)
    events: list[str] = []
    lock = threading.Lock()

    def fp32(name: str) -> None:
        with ptorch.library_math(CudaMath.FP32):
            both_inside.wait()  # raises BrokenBarrierError if the scopes were serialized
            with lock:
                events.append(f"{name} in {tuple(s.allow_tf32 for s in switches)}")
            if name == "a":
                tf32_thread.start()
            threading.Event().wait(0.05)  # the TF32 thread asks meanwhile
            with lock:
                events.append(f"{name} out")

    def tf32() -> None:
        with ptorch.library_math(CudaMath.TF32), lock:
            events.append(f"tf32 in {tuple(s.allow_tf32 for s in switches)}")

    tf32_thread = threading.Thread(target=tf32)
    threads = [threading.Thread(target=fp32, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tf32_thread.join()
    assert sorted(events[:2]) == ["a in (False, False)", "b in (False, False)"]
    assert sorted(events[2:4]) == ["a out", "b out"]
    assert events[4] == "tf32 in (True, True)"
    assert tuple(switch.allow_tf32 for switch in switches) == before


def test_a_scope_joining_an_open_one_sets_the_switches_that_work_outside_changed():
    """A TF32 scope is open on one thread; outside every scope the switches are turned
    off (as pyannote's `Pipeline.__call__` does before each file); a TF32 scope that
    joins on another thread sees them on again, and after both the switches are as
    before the first."""
    import threading

    from pyspk.cuda import CudaMath

    switches = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(switch.allow_tf32 for switch in switches)
    opened, joined = threading.Event(), threading.Event()
    seen = []

    def first() -> None:
        with ptorch.library_math(CudaMath.TF32):
            opened.set()
            assert joined.wait(5)

    thread = threading.Thread(target=first)
    thread.start()
    assert opened.wait(5)
    for switch in switches:
        switch.allow_tf32 = False
    with ptorch.library_math(CudaMath.TF32):
        seen.append(tuple(switch.allow_tf32 for switch in switches))
        joined.set()
    thread.join(5)
    assert not thread.is_alive()
    assert seen == [(True, True)]
    assert tuple(switch.allow_tf32 for switch in switches) == before


def test_a_thread_alone_may_nest_the_other_math():
    from pyspk.cuda import CudaMath

    switches = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(switch.allow_tf32 for switch in switches)
    with ptorch.library_math(CudaMath.FP32):
        with ptorch.library_math(CudaMath.TF32):
            assert all(switch.allow_tf32 for switch in switches)
            with ptorch.library_math(CudaMath.TF32):
                assert all(switch.allow_tf32 for switch in switches)
        assert not any(switch.allow_tf32 for switch in switches)
    assert tuple(switch.allow_tf32 for switch in switches) == before


def test_overlapping_scopes_leave_the_warning_filters_as_they_were():
    """A enters, B enters, A leaves, B leaves: out of nesting order, as two engines'
    passes end. The process's warning filters are then as before (no filter of the
    scopes is left behind or lost), and so are the switches."""
    import threading

    from pyspk.cuda import CudaMath

    filters = list(warnings.filters)
    switches = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(switch.allow_tf32 for switch in switches)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with ptorch.library_math(CudaMath.TF32):
            a_in.set()
            assert b_in.wait(5)
        a_out.set()

    def b() -> None:
        assert a_in.wait(5)
        with ptorch.library_math(CudaMath.TF32):
            b_in.set()
            assert a_out.wait(5)
            assert all(switch.allow_tf32 for switch in switches)  # A's leaving kept them

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert a_out.is_set() and b_in.is_set()
    assert warnings.filters == filters
    assert tuple(switch.allow_tf32 for switch in switches) == before


def test_a_waiting_scope_of_the_other_math_is_not_starved():
    """A holds FP32; a TF32 scope asks and waits; an FP32 scope asked for after it waits
    too, and opens only after the TF32 one has ended."""
    import threading
    import time

    from pyspk.cuda import CudaMath
    from pyspk.torch._math import _MATH_SCOPES

    order: list[str] = []
    a_in, a_leave = threading.Event(), threading.Event()

    def a() -> None:
        with ptorch.library_math(CudaMath.FP32):
            a_in.set()
            assert a_leave.wait(5)
            order.append("a out")

    def scope(math: CudaMath, name: str) -> None:
        with ptorch.library_math(math):
            order.append(name)

    def waiting(math: CudaMath) -> bool:
        deadline = time.monotonic() + 5
        while _MATH_SCOPES._waiting[math] == 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    first = threading.Thread(target=a)
    first.start()
    assert a_in.wait(5)
    tf32 = threading.Thread(target=scope, args=(CudaMath.TF32, "tf32"))
    tf32.start()
    assert waiting(CudaMath.TF32)
    fp32 = threading.Thread(target=scope, args=(CudaMath.FP32, "late fp32"))
    fp32.start()
    assert waiting(CudaMath.FP32)  # it did not join A's open FP32 scopes
    a_leave.set()
    for thread in (first, tf32, fp32):
        thread.join()
    assert order == ["a out", "tf32", "late fp32"]


def test_released_scopes_let_another_thread_in_and_come_back_in_order():
    """A thread in a TF32 scope with an FP32 one nested in it lets both go for a block:
    another thread then opens an FP32 scope (it would wait for the TF32 one for good
    otherwise) and the block waits for it to be open; after the block the thread's two
    scopes are back, the inner FP32 one last, and once all end the switches are as
    before."""
    import threading

    from pyspk.cuda import CudaMath
    from pyspk.torch._math import library_math_released

    switches = torch.backends.cuda.matmul, torch.backends.cudnn
    before = tuple(switch.allow_tf32 for switch in switches)
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with ptorch.library_math(CudaMath.FP32):
            inside.set()
            assert leave.wait(5)

    thread = threading.Thread(target=other)
    with ptorch.library_math(CudaMath.TF32), ptorch.library_math(CudaMath.FP32):
        with library_math_released():
            thread.start()
            assert inside.wait(5), "the other thread's scope never opened"
            leave.set()
        # the TF32 scope waited for the other thread's FP32 one; the FP32 one nests in it
        assert not any(switch.allow_tf32 for switch in switches)
    thread.join(5)
    assert not thread.is_alive()
    assert tuple(switch.allow_tf32 for switch in switches) == before
