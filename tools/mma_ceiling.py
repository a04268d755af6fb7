"""What `mma.sync` sustains on this GPU in the two shapes the tensor-core kernels use,
m16n8k8 TF32 and m16n8k16 FP16 (FP32 accumulation both): the ceilings those kernels are
measured against (docs/performance.md).

A kernel written here in PTX (sm_80 target, JIT-compiled by the driver, as the shipped
tier's PTX can be) keeps every warp issuing mma into `tiles` independent accumulators
from register operands, with no memory traffic in the loop (one b register steps by one
per iteration). Each configuration launches 5 times after a warm-up, timed by CUDA
events; TFLOPS count 2 * 16 * 8 * k per mma, and "ns/mma/SM" is the time one SM takes
per mma.

    PYTHONPATH=. python3 tools/mma_ceiling.py [--ptx TILES]
"""

from __future__ import annotations

import argparse

from pyspk.cuda import driver
from pyspk.cuda.events import EventPhases
from pyspk.cuda.kernels import Kernel
from pyspk.cuda.runtime import CudaRuntime

ITERATIONS = 2048
REPEATS = 5
# shape -> (instruction, k); both take four a and two b registers
SHAPES = {
    "tf32 m16n8k8": ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 8),
    "fp16 m16n8k16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 16),
}
# (tiles, warps per block, blocks per SM)
CONFIGS = [(8, 4, 1), (8, 8, 1), (8, 4, 4), (8, 8, 2), (8, 16, 1), (2, 32, 1)]


def ptx(tiles: int, mma: str = SHAPES["tf32 m16n8k8"][0]) -> str:
    """The kernel `mma_chains(out, out_len, iterations)` with `tiles` accumulators."""
    acc = [[f"%d{4 * t + e}" for e in range(4)] for t in range(tiles)]
    loop = "\n    ".join(
        f"{mma} {{{', '.join(d)}}}, {{%a0, %a1, %a2, %a3}}, {{%b0, %b1}}, {{{', '.join(d)}}};"
        for d in acc
    )
    zeros = " ".join(f"mov.f32 {r}, 0f00000000;" for row in acc for r in row)
    sums = " ".join(f"add.f32 %s, %s, {r};" for row in acc for r in row)
    return f""".version 7.0
.target sm_80
.address_size 64
.visible .entry mma_chains(.param .u64 out, .param .u64 out_len, .param .u32 iterations)
{{
    .reg .pred %p;
    .reg .b32 %a<4>, %b<2>, %i, %n;
    .reg .f32 %d<{4 * tiles}>, %s;
    .reg .u64 %o;
    mov.u32 %a0, %tid.x;
    add.u32 %a1, %a0, 0x3f800000;
    xor.b32 %a2, %a1, 0x00400000;
    or.b32 %a3, %a0, 0x3e000000;
    xor.b32 %b0, %a3, 0x00010000;
    xor.b32 %b1, %a1, 0x00020000;
    {zeros}
    ld.param.u32 %n, [iterations];
    mov.u32 %i, 0;
LOOP:
    {loop}
    add.u32 %b0, %b0, 1;
    add.u32 %i, %i, 1;
    setp.lt.u32 %p, %i, %n;
    @%p bra LOOP;
    // the sum is stored only if it is exactly 1.0, which keeps the products live
    mov.f32 %s, 0f00000000;
    {sums}
    setp.eq.f32 %p, %s, 0f3F800000;
    ld.param.u64 %o, [out];
    @%p st.global.f32 [%o], %s;
    ret;
}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptx", type=int, metavar="TILES", help="print the kernel and stop")
    parser.add_argument("--shape", choices=SHAPES, default="tf32 m16n8k8", help="with --ptx")
    args = parser.parse_args()
    if args.ptx:
        print(ptx(args.ptx, SHAPES[args.shape][0]))
        return 0

    with CudaRuntime(0) as runtime:
        sms = runtime.device.multiprocessors
        out = runtime.alloc_zeros(1)
        phases = EventPhases(runtime)
        print(f"{runtime.device.name}, {sms} SMs; {ITERATIONS} iterations, {REPEATS} launches")
        for shape, (mma, k) in SHAPES.items():
            print(shape)
            # one module (one JIT compile) per accumulator count
            modules = {
                tiles: driver.call("cuModuleLoadData", ptx(tiles, mma).encode() + b"\0")
                for tiles in {tiles for tiles, _, _ in CONFIGS}
            }
            for tiles, warps, per_sm in CONFIGS:
                handle = driver.call("cuModuleGetFunction", modules[tiles], b"mma_chains")
                launch = Kernel("mma_chains", handle, None).launch(
                    sms * per_sm, 32 * warps, 0, ("ptr", "u64", "u32"), [out.ptr, 1, ITERATIONS]
                )
                launch.enqueue(runtime.stream)

                def repeat(launch=launch) -> None:
                    for _ in range(REPEATS):
                        launch.enqueue(runtime.stream)

                phases.op(tiles, repeat)
                ms = phases.elapsed_ms()[tiles] / REPEATS
                mmas = sms * per_sm * warps * ITERATIONS * tiles
                print(
                    f"{tiles} accumulators, {warps:2d} warps x {per_sm} blocks per SM: "
                    f"{mmas * 2 * 16 * 8 * k / ms / 1e9:6.1f} TFLOPS, "
                    f"{ms * 1e6 / (mmas / sms):.3f} ns/mma/SM"
                )
            for module in modules.values():
                driver.call("cuModuleUnload", module)
        phases.close()
        out.free()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
