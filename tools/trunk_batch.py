"""Per-chunk time of WeSpeaker's embedding forward (Fbank, the ResNet34 trunk, pooling,
seg_1, all on the library) replayed as a CUDA graph at batch 32, 64, 96 and 128, in
FP32 and TF32 math: why the engine embeds 32 chunks a forward
(benchmarks/h200-trunk-batch.txt).

    PYTHONPATH=. python3 tools/trunk_batch.py
"""

from __future__ import annotations

import os
import warnings


def main() -> None:
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "false")
    warnings.simplefilter("ignore")
    import torch

    import pyspk.pyannote as pa
    from pyspk.cuda import CudaMath
    from pyspk.pyannote.fbank import Fbank
    from pyspk.testing import torch_graph
    from pyspk.torch import library_math

    model = pa.wespeaker_resnet34(seed=1).cuda()
    fbank = Fbank(model, torch.device("cuda"))
    resnet = model.resnet

    def forward(waveforms: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return resnet.forward_embedding(resnet.forward_frames(fbank(waveforms)), weights=masks)[1]

    for math in (CudaMath.FP32, CudaMath.TF32):
        with torch.inference_mode(), library_math(math):
            for batch in (32, 64, 96, 128):
                waveforms = torch.randn(batch, 1, 160_000, device="cuda") * 0.1
                masks = (torch.rand(batch, 3, 589, device="cuda") > 0.5).float()
                graph, _ = torch_graph(torch, lambda w=waveforms, m=masks: forward(w, m))
                for _ in range(2):
                    graph.replay()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                replays = max(2, 256 // batch)
                start.record()
                for _ in range(replays):
                    graph.replay()
                end.record()
                end.synchronize()
                per_chunk = start.elapsed_time(end) / replays / batch
                print(f"{math} batch {batch}: {per_chunk:.3f} ms per chunk", flush=True)
                del graph


if __name__ == "__main__":
    main()
