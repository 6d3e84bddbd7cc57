"""``sedsynth bench train``: the loader's rate alone and the training step's rate, in one run.

Loader: items made in this process (one worker) from the first source: for shards, FLAC decode,
crop, frame labels and cluster negatives, in clips/s, against the peer measured on the same
rows in the same run: plain ``soundfile`` decoding of the same FLAC bytes; for a mixing source,
the rows mixed and relabeled with its sources already decoded (as a worker's are after its first
use of each), then the same items, with no peer. Step: forward,
backward and optimizer step of the configured model on prepared batches (the loader excluded),
in steps/s and clips/s; on CUDA also peak memory and model FLOPs utilisation (FLOPs counted by
``torch.utils.flop_counter`` for one eager step, over the step time, over the GPU's peak), and
with ``profile`` where the step's GPU time goes by kind of kernel. With ``train.compile`` the
step is timed after :func:`trainer.model.compile_model` and a compiled warm-up step per batch and one more. The last
line says how many loader workers per GPU keep the step fed.

``--preset gpu`` is FineLAP's GPU setting for throughput: eat-base, a BERT/RoBERTa-base-size
text tower (random weights, the same FLOPs), d = 1024, batch 128, bf16, text tower training, its
texts padded to blocks of 64 rows and 30 tokens (``train.model.text_pad_rows``).

The step takes ``batches`` batches of different rows in turn (default 2; by default the loader
makes a row for every clip of them), so the text tower sees a new set of texts every step, as
it does in the loop: one batch repeated would let ``torch.compile`` keep one static shape that
training never has.
"""

from __future__ import annotations

import io
import time
from dataclasses import replace

import soundfile as sf
import torch


def _peak_tflops(name: str, override: float | None) -> float | None:
    from trainer.precision import peak_bf16_flops

    if override:
        return override
    peak = peak_bf16_flops(name)
    return peak / 1e12 if peak else None


def gpu_preset(params):
    t = params.train
    model = replace(
        t.model,
        encoder="eat-base",
        embed_dim=1024,
        adapter_ffn=4096,
        text_model="random:bert-base",
        freeze_text=False,
        text_pad_rows=64,
    )
    data = replace(t.data, batch_size=128)
    return replace(params, train=replace(t, model=model, data=data, precision="bf16"))


def bench_loader(params, encoder, rows: int) -> dict:
    from trainer.data.mixing import MixingSource
    from trainer.data.stream import make_stream

    stream = make_stream(params, encoder, params.train.data.sources[:1], shuffle=True)
    stream.set_epoch(0)
    source = stream.sources[0]
    pieces, left = [], rows
    for piece in sorted({p for d in stream.plan(1) for p in d.pieces[0]}, key=lambda p: (p.file, p.row_group, p.start)):
        pieces.append(replace(piece, stop=min(piece.stop, piece.start + left)))
        left -= pieces[-1].stop - piece.start
        if left <= 0:
            break
    raw = [r for piece in pieces for r in source.read(piece)]
    mixing_s = 0.0
    if isinstance(source, MixingSource):  # time the warm source (each worker decodes a source once, then keeps it)
        t0 = time.perf_counter()
        raw = [r for piece in pieces for r in source.read(piece)]
        mixing_s = time.perf_counter() - t0
    out = {"rows": len(raw), "kind": params.train.data.sources[0].kind}
    if all("bytes" in r["audio"] for r in raw):  # stored rows: the peer decodes the same FLAC bytes
        t0 = time.perf_counter()
        for r in raw:
            sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32")
        decode_s = time.perf_counter() - t0
        out |= {"decode_clips_per_s": len(raw) / decode_s, "decode_ms": 1000 * decode_s / len(raw)}
    t0 = time.perf_counter()
    items = [stream.builder(r, 0, 0) for r in raw]
    item_s = time.perf_counter() - t0
    # a mixing source's rows were made in read() above: its rate counts the mixing and the items
    made_s = item_s + mixing_s
    return out | {"loader_clips_per_s": len(raw) / made_s, "loader_ms": 1000 * made_s / len(raw), "items": items}


KERNEL_KINDS = (  # (kind, substrings of a CUDA kernel's name), first match wins
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_")),
    ("fft (fbank)", ("fft",)),
    ("optimizer", ("adam", "multi_tensor")),
    ("copy", ("memcpy", "memset")),
    ("norm / reduce / softmax", ("norm", "reduce", "softmax")),
)


def kernel_kind(name: str) -> str:
    """The kind of work a CUDA kernel called ``name`` does, for the profile's summary."""
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "elementwise / other")


def profile_steps(step, steps: int = 3) -> dict:
    """Run ``step`` ``steps`` times under ``torch.profiler``: wall ms per step, GPU busy ms per step
    (kernels and copies), busy ms per :func:`kernel_kind`, and the 8 kernels that take longest."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    wall_ms = 1000 * (time.perf_counter() - t0) / steps
    kinds: dict[str, float] = {}
    kernels = []
    for e in prof.key_averages():
        us = e.self_device_time_total if e.device_type == torch.autograd.DeviceType.CUDA else 0
        if us > 0:
            kind = kernel_kind(e.key)
            kinds[kind] = kinds.get(kind, 0.0) + us / steps / 1000
            kernels.append((us / steps / 1000, e.key))
    return {
        "wall_ms": wall_ms,
        "busy_ms": sum(kinds.values()),
        "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "top": sorted(kernels, reverse=True)[:8],
    }


def bench_step(params, model, items, steps: int, peak_override: float | None, profile: bool = False, batches: int = 2) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from trainer.data.stream import collate
    from trainer.model import compile_model
    from trainer.objective import Objective
    from trainer.optim import optimizer_for, passes_per_step
    from trainer.precision import autocast_for
    from trainer.stages.train import clip_gradients

    t = params.train
    device = torch.device("cuda") if torch.cuda.is_available() and t.device != "cpu" else torch.device("cpu")
    objective = Objective(model, t.loss).to(device)
    model.encoder.keep_residual_low_precision(t.bf16_residual)
    optimizer = optimizer_for(objective, t.optim)
    autocast = autocast_for(t.precision, device)
    b = t.data.batch_size
    # ``batches`` batches of different rows, taken in turn as the loop's batches come (their texts, and
    # so the text tower's shapes, differ); fewer rows than that: repeated (fewer distinct texts)
    pool = [items[i % len(items)] for i in range(b * batches)]
    prepared = [collate(pool[k * b : (k + 1) * b]).to(device) for k in range(batches)]
    taken = [0]

    def loss_backward() -> torch.Tensor:
        with autocast():
            loss = objective(prepared[taken[0] % batches])["loss"]
        loss.backward()
        return loss

    def step():  # as the training loop's step does it: clip the gradient's norm (without SAM), AdamW
        loss_backward()
        if passes_per_step(optimizer) == 2:  # SAM: the closure's second pass at the perturbed weights
            optimizer.step(loss_backward)
        else:
            clip_gradients(objective, t.optim.clip_grad_norm)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        taken[0] += 1

    for _ in range(batches):  # warm-up (and the frozen text cache, when frozen)
        step()
    counter = FlopCounterMode(display=False)
    with counter:  # eager, a step of each batch: the compiled step does the same FLOPs
        for _ in range(batches):
            step()
    flops = counter.get_total_flops() / batches
    compile_s = 0.0
    if t.compile:
        t0 = time.perf_counter()
        compile_model(model, t.compile_mode)
        for _ in range(batches + 1):  # each batch's shapes, then one more: what a new shape recompiled settles
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / steps
    out = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)",
        "batch": b,
        "batches": batches,
        "distinct_rows": min(b * batches, len(items)),
        "step_s": seconds,
        "clips_per_s": b / seconds,
        "passes_per_step": passes_per_step(optimizer),
        "params_m": sum(p.numel() for p in objective.parameters() if p.requires_grad) / 1e6,
        "gflop_per_step": flops / 1e9,
        "tflops": flops / seconds / 1e12,
        "compiled": t.compile,
        "compile_s": compile_s,
    }
    if device.type == "cuda":
        out["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        peak = _peak_tflops(out["device"], peak_override)
        out["mfu"] = out["tflops"] / peak if peak else float("nan")
        if profile:
            out["profile"] = profile_steps(step)
    return out


def run(
    params,
    rows: int | None = None,
    steps: int = 5,
    preset: str = "default",
    peak_tflops: float | None = None,
    profile: bool = False,
    batch: int | None = None,
    batches: int = 2,
) -> dict:
    from trainer.model import build_model

    if preset == "gpu":
        params = gpu_preset(params)
    if batch:
        params = replace(params, train=replace(params.train, data=replace(params.train.data, batch_size=batch)))
    torch.manual_seed(params.seed)
    model = build_model(params.train.model)
    loader = bench_loader(params, model.encoder, rows or batches * params.train.data.batch_size)
    step = bench_step(params, model, loader.pop("items"), steps, peak_tflops, profile, batches)
    return {"loader": loader, "step": step, "model": params.train.model.encoder, "precision": params.train.precision}


def print_figures(f: dict) -> None:
    lo, st = f["loader"], f["step"]
    repeated = " (rows repeated to fill them)" if st["distinct_rows"] < st["batch"] * st["batches"] else ""
    print(
        f"bench train: {lo['rows']} {lo['kind']} rows, encoder {f['model']}, {st['batches']} batches of {st['batch']} in turn{repeated}"
    )
    if "decode_clips_per_s" in lo:
        print("  loader, one worker (decode, crop, frame labels, negatives):")
        print(
            f"    FLAC decode alone (soundfile)     {lo['decode_clips_per_s']:8.0f} clips/s  ({lo['decode_ms']:.2f} ms)   <- peer"
        )
        print(
            f"    loader items                      {lo['loader_clips_per_s']:8.0f} clips/s  ({lo['loader_ms']:.2f} ms)   (target >= 300)"
        )
        print(f"    loader / decode                   {lo['loader_clips_per_s'] / lo['decode_clips_per_s']:8.2f}")
    else:  # a mixing source: nothing is decoded per row, so there is no decoding peer
        print(f"  loader, one worker, {lo['kind']} source, warm (mix, relabel, crop, frame labels, negatives):")
        print(f"    loader items                      {lo['loader_clips_per_s']:8.0f} clips/s  ({lo['loader_ms']:.2f} ms)")
    print(f"  training step on {st['device']} ({st['params_m']:.1f} M trainable parameters):")
    print(
        f"    {st['step_s'] * 1000:.0f} ms/step, {st['clips_per_s']:.1f} clips/s, {st['gflop_per_step']:.0f} GFLOP/step "
        f"({1000 * st['tflops']:.0f} GFLOP/s), {st['passes_per_step']} forward/backward pass(es) per step"
        + (" (SAM)" if st["passes_per_step"] == 2 else "")
    )
    if st["compiled"]:
        print(f"    torch.compile (encoder, text tower when it trains, frame adapter) took {st['compile_s']:.0f} s before timing")
    if "mfu" in st:
        print(f"    MFU {100 * st['mfu']:.1f}% (target >= 40%), peak memory {st['peak_mem_gib']:.1f} GiB")
    if "profile" in st:
        pr = st["profile"]
        print(
            f"  where the step's time goes (torch.profiler, 3 steps): {pr['wall_ms']:.0f} ms/step, GPU busy {pr['busy_ms']:.0f} ms "
            f"({100 * pr['busy_ms'] / pr['wall_ms']:.0f}%)"
        )
        for kind, ms in pr["kinds"].items():
            print(f"    {kind:26s} {ms:7.1f} ms/step")
        print("    longest kernels:")
        for ms, name in pr["top"]:
            print(f"      {ms:7.1f} ms  {name[:90]}")
    print(f"  loader workers per device to keep the step fed: {st['clips_per_s'] / lo['loader_clips_per_s']:.2f}")
