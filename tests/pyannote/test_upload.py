"""`PieceUpload` and `to_host` on the CPU, with PyTorch's stream, event and stream-scope
calls replaced by recording fakes: the pieces' bounds, each stream's waits, one whole
copy where the forwards run on the upload's own stream, and the host copies' order."""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

from pyspk.pyannote._upload import PieceUpload, to_host  # noqa: E402


class FakeStream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle
        self.waited: list[object] = []

    def wait_event(self, event: object) -> None:
        self.waited.append(event)


@pytest.fixture
def caller(monkeypatch: pytest.MonkeyPatch) -> FakeStream:
    stream = FakeStream(1)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())

    class Event:
        def record(self, s: FakeStream) -> None:
            assert s is stream  # every piece is recorded on the caller's stream

    monkeypatch.setattr(torch.cuda, "Event", Event)
    return stream


def waveform(samples: int) -> torch.Tensor:
    return torch.arange(1, samples + 1, dtype=torch.float32)[None]


def test_each_forward_waits_for_the_samples_its_chunks_read(caller) -> None:
    source = waveform(1000)
    audio = torch.zeros(1, 1100)  # the padded tail stays zero
    upload = PieceUpload(audio, source, window=300, step=100)
    segmentation = FakeStream(2)
    upload.through(3, segmentation)  # chunks 0..2 read samples 0..499
    assert torch.equal(audio[:, :500], source[:, :500]) and not audio[:, 500:].any()
    upload.through(3, segmentation)  # nothing new: the same piece's event again
    assert segmentation.waited[0] is segmentation.waited[1]
    upload.through(20, segmentation)  # past the waveform: its end
    assert torch.equal(audio[:, :1000], source) and not audio[:, 1000:].any()
    assert len(segmentation.waited) == 3 and segmentation.waited[2] is not segmentation.waited[0]


def test_on_the_uploads_own_stream_the_first_forward_takes_the_whole_copy(caller) -> None:
    source = waveform(1000)
    audio = torch.zeros(1, 1000)
    upload = PieceUpload(audio, source, window=300, step=100)
    upload.through(1, caller)
    assert torch.equal(audio, source)
    upload.through(8, caller)
    assert caller.waited[0] is caller.waited[1]  # no second copy


def test_the_host_copies_wait_for_their_inputs_and_leave_no_stream_record(
    caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`to_host` copies once `after` has happened and returns the copies' end event. It
    makes no `record_stream`: PyTorch's allocator forgets one made while any thread
    captures, if the tensor is freed then too, so the caller holds the device tensors
    until the event instead (`Engine._queue_models` keeps them in `_Queued.outputs`)."""
    recorded: list[object] = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: recorded.append(s))

    class CopyStream(FakeStream):
        def record_event(self) -> str:
            return "copied"

    copying = CopyStream(3)
    tensors = (torch.ones(2), torch.arange(3.0))
    copies, done = to_host(copying, "segmented", *tensors)  # type: ignore[arg-type]
    assert copying.waited == ["segmented"] and done == "copied"
    assert [copy.tolist() for copy in copies] == [tensor.tolist() for tensor in tensors]
    assert recorded == []
