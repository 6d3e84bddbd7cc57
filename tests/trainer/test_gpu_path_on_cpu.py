"""The GPU preset's path, run on the CPU at tiny sizes.

``sedsynth bench train --preset gpu`` and configs/train/finelap.yaml train an eat-base ViT
encoder, the transformer adapter and a trainable BERT-style text tower under bf16 autocast.
Here the same architecture (2 blocks of width 32, a 2-layer BERT saved with the offline
tokenizer, 128 fbank frames) goes through ``torch.autocast("cpu", dtype=torch.bfloat16)``: the
losses, the backward pass, an optimizer step and a checkpoint round trip; and ``torch.compile``
of the encoder gives the eager results where a C compiler is present.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import torch

from benchmarks.train import gpu_preset
from trainer import checkpoint
from trainer.config import Params
from trainer.data.stream import Batch
from trainer.encoders import EATEncoder
from trainer.features import FbankParams
from trainer.model import FineLAP
from trainer.objective import Objective
from trainer.optim import optimizer_for
from trainer.precision import autocast_for
from trainer.text import OFFLINE_MODEL, TextEncoder, resolve_model_path

GPU = gpu_preset(Params()).train
BF16 = autocast_for(GPU.precision, torch.device("cpu"))


def test_the_preset_is_the_one_exercised_here():
    m = GPU.model
    assert (m.encoder, m.adapter, m.freeze_text, GPU.precision) == ("eat-base", "transformer", False, "bf16")
    with BF16():
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """A local model folder: a 2-layer BERT with random weights and the offline tokenizer
    (the preset's ``random:bert-base`` in miniature)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(OFFLINE_MODEL))
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def tiny_objective(text_folder: str, seed: int = 0) -> Objective:
    """The preset's model (eat-base layout, transformer adapter, trainable text tower) at tiny sizes."""
    m = GPU.model
    torch.manual_seed(seed)
    encoder = EATEncoder(dim=32, depth=2, heads=2, fbank=FbankParams(target_frames=128))
    text = TextEncoder(text_folder, m.text_pooling, m.text_max_tokens, frozen=m.freeze_text)
    model = FineLAP(
        encoder,
        text,
        dim=16,
        adapter=m.adapter,
        adapter_ffn=32,
        adapter_heads=4,
        dropout=m.dropout,
        per_text_logits=m.per_text_logits,
    )
    return Objective(model, replace(GPU.loss, frame_chunk_clips=2))


def tiny_batch(objective: Objective, B: int = 3, N: int = 4, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    enc = objective.model.encoder
    labels = torch.rand(B, N, enc.num_frames, generator=g) < 0.3
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[-1, -1] = False
    phrases = [["dog bark", "rain", "car horn", "siren"], ["rain", "dog bark", "bell", "wind"], ["siren", "bell", "car horn", ""]]
    return Batch(
        ids=[str(i) for i in range(B)],
        wave=torch.randn(B, enc.fbank.input_samples(), generator=g) * 0.1,
        captions=["a dog barks in the rain", "rain and a bell", "a siren passes"][:B],
        phrases=phrases[:B],
        labels=labels,
        mask=mask,
        has_frames=torch.ones(B, dtype=torch.bool),
        skips=[],
    )


def test_encoder_features_stay_float32_under_autocast():
    torch.manual_seed(0)
    enc = EATEncoder(dim=32, depth=1, heads=2, fbank=FbankParams(target_frames=128))
    wave = torch.randn(2, enc.fbank.input_samples()) * 0.1
    reference = enc.features(wave)
    with BF16():
        feats = enc.features(wave)
    assert feats.dtype == torch.float32 and torch.equal(feats, reference)


def test_bf16_residual_stores_the_stream_in_bf16_and_stays_close():
    """``train.bf16_residual``: under autocast every block hands on a bf16 stream (the norms still
    compute in float32), the encoder's outputs are float32 as before and within bf16 rounding of
    the float32 stream's; without autocast it changes nothing; its gradients point the same way."""
    torch.manual_seed(0)
    enc = EATEncoder(dim=32, depth=2, heads=2, fbank=FbankParams(target_frames=128))
    wave = torch.randn(2, enc.fbank.input_samples()) * 0.1
    probe_cls, probe_dense = torch.randn(2, 32), torch.randn(2, 8, 8, 32)  # (B, D), (B, L, F, D)
    streams = []
    hook = enc.blocks[0].register_forward_hook(lambda m, i, o: streams.append(o.dtype))
    runs, plain = [], []
    for low in (False, True):
        enc.keep_residual_low_precision(low)
        enc.zero_grad()
        with BF16():
            cls, dense = enc(wave)
        ((cls * probe_cls).sum() + (dense * probe_dense).sum()).backward()
        runs.append((cls, dense, enc.patch_embed.weight.grad.clone()))
        with torch.no_grad():
            plain.append(enc(wave)[0])  # no autocast
    hook.remove()
    assert streams == [torch.float32, torch.float32, torch.bfloat16, torch.float32]
    assert torch.equal(plain[0], plain[1])
    (c0, d0, g0), (c1, d1, g1) = runs
    assert c1.dtype == d1.dtype == torch.float32
    assert not torch.equal(c1, c0)
    assert torch.allclose(c1, c0, atol=0.05) and torch.allclose(d1, d0, atol=0.05)
    assert torch.nn.functional.cosine_similarity(g1.flatten(), g0.flatten(), dim=0) > 0.99


def test_bf16_residual_on_an_encoder_without_a_residual_stream_is_one_line():
    from trainer.encoders import EncoderError, build_encoder

    cnn = build_encoder("small")
    cnn.keep_residual_low_precision(False)  # off: nothing to do
    with pytest.raises(
        EncoderError, match=r"train.bf16_residual applies to the ViT encoders \(eat-base, tiny-vit\); SmallEncoder"
    ):
        cnn.keep_residual_low_precision(True)


def test_bf16_losses_backward_and_step(tiny_bert):
    objective = tiny_objective(tiny_bert).train()
    batch = tiny_batch(objective)
    torch.manual_seed(1)
    fp32 = {k: v.detach().item() for k, v in objective(batch).items()}
    torch.manual_seed(1)  # the same dropout masks
    with BF16():
        terms = objective(batch)
    assert set(terms) == set(fp32) >= {"loss", "clip", "frame"}
    for k, v in terms.items():
        assert v.dtype == torch.float32 and v.dim() == 0 and torch.isfinite(v), k
        assert v.detach().item() == pytest.approx(fp32[k], rel=0.05, abs=0.05), k
    terms["loss"].backward()
    trained = {n: p for n, p in objective.named_parameters() if p.requires_grad}
    assert any(n.startswith("model.text.model.") for n in trained)  # the text tower trains, as in the preset
    for name, p in trained.items():
        assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), name
    for part in (
        "model.encoder.blocks.0.attn.qkv.weight",
        "model.local.body.layers.0.linear1.weight",
        "model.text_proj.0.weight",
    ):
        assert trained[part].grad.abs().sum() > 0, part
    optimizer = optimizer_for(objective, GPU.optim)
    before = {n: p.detach().clone() for n, p in trained.items()}
    optimizer.step()
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in trained.values())
    assert not torch.equal(before["model.encoder.blocks.0.attn.qkv.weight"], trained["model.encoder.blocks.0.attn.qkv.weight"])


def test_bf16_checkpoint_round_trip(tiny_bert, tmp_path):
    first = tiny_objective(tiny_bert, seed=0).train()
    optimizer = optimizer_for(first, GPU.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    batch = tiny_batch(first)
    for _ in range(2):
        with BF16():
            loss = first(batch)["loss"]
        loss.backward()
        optimizer.step(), scheduler.step(), optimizer.zero_grad()
    path = tmp_path / "latest.pt"
    checkpoint.save(
        path,
        first,
        optimizer=optimizer,
        scheduler=scheduler,
        step=2,
        epoch=0,
        batches_in_epoch=2,
        config={"train": {"precision": "bf16"}},
    )
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    second = tiny_objective(tiny_bert, seed=1)
    optimizer2 = optimizer_for(second, GPU.optim)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(optimizer2, lambda s: 1.0)
    state = checkpoint.restore(checkpoint.read(path), second, optimizer2, scheduler2, path=path)
    assert state["step"] == 2
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    first.eval(), second.eval()
    with torch.no_grad(), BF16():
        ta, tb = first(batch), second(batch)
    assert all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.compile
# torch's own inductor import (torch.utils.mkldnn) still uses torch.jit.script_method
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None,
    reason="no C compiler: torch.compile's CPU backend (inductor) needs one",
)
def test_compiled_encoder_matches_eager_under_bf16():
    """Tiny on purpose: a cold inductor cache spends about a minute compiling forward and backward."""
    torch.manual_seed(0)
    eager = EATEncoder(dim=16, depth=1, heads=2, fbank=FbankParams(target_frames=32))
    compiled = EATEncoder(dim=16, depth=1, heads=2, fbank=FbankParams(target_frames=32))
    compiled.load_state_dict(eager.state_dict())
    compiled.compile()  # as train.compile does
    g = torch.Generator().manual_seed(3)
    wave = torch.randn(2, eager.fbank.input_samples(), generator=g) * 0.1
    probe_cls, probe_dense = torch.randn(2, 16, generator=g), torch.randn(2, 2, 8, 16, generator=g)  # (B, D), (B, L, F, D)
    outputs = []
    for enc in (eager, compiled):
        with BF16():
            cls, dense = enc(wave)
        ((cls.float() * probe_cls).sum() + (dense.float() * probe_dense).sum()).backward()
        outputs.append((cls.float(), dense.float(), enc.patch_embed.weight.grad.clone()))
    (c0, d0, g0), (c1, d1, g1) = outputs
    assert c1.shape == c0.shape and d1.shape == d0.shape
    assert torch.allclose(c1, c0, atol=0.05) and torch.allclose(d1, d0, atol=0.05)  # bf16 rounding apart
    assert torch.nn.functional.cosine_similarity(g1.flatten(), g0.flatten(), dim=0) > 0.99


def test_compile_model_compiles_the_modules_that_hold_the_flops(tiny_bert):
    """``train.compile`` wraps the encoder, the trainable text tower and the frame adapter (lazily:
    nothing compiles until a forward pass); a frozen text tower, encoded once and cached, stays eager."""
    from trainer.model import compile_model

    trained = tiny_objective(tiny_bert).model
    compile_model(trained)
    assert all(m._compiled_call_impl is not None for m in (trained.encoder, trained.text.model, trained.local))
    frozen = FineLAP(
        EATEncoder(dim=16, depth=1, heads=2, fbank=FbankParams(target_frames=32)),
        TextEncoder(tiny_bert, frozen=True),
        dim=8,
        adapter_ffn=16,
        adapter_heads=2,
    )
    compile_model(frozen)
    assert frozen.encoder._compiled_call_impl is not None and frozen.text.model._compiled_call_impl is None


def test_compile_model_passes_train_compile_mode(tiny_bert, monkeypatch):
    from trainer.model import compile_model

    model = tiny_objective(tiny_bert).model
    modes = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: modes.append(kw))
    compile_model(model, "max-autotune-no-cudagraphs")
    assert modes == [{"mode": "max-autotune-no-cudagraphs"}] * 3
