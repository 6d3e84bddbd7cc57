"""``sedsynth bench train``: the step it times is the loop's step, SAM's second pass included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.train import kernel_kind, run
from tests.conftest import tiny_train_params


@pytest.mark.parametrize("sam_rho", [0.0, 0.075])
def test_the_timed_step_takes_sams_second_pass(shard_folder, tmp_path, one_torch_thread, sam_rho):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "unused")
    p = replace(p, train=replace(p.train, device="cpu", optim=replace(p.train.optim, sam_rho=sam_rho)))
    figures = run(p, rows=8, steps=1)
    step = figures["step"]
    assert step["passes_per_step"] == (2 if sam_rho else 1)
    assert step["step_s"] > 0 and step["gflop_per_step"] > 0


def test_batch_overrides_the_params_and_the_preset(shard_folder, tmp_path, one_torch_thread):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "unused")
    p = replace(p, train=replace(p.train, device="cpu"))
    assert run(p, rows=4, steps=1, batch=3)["step"]["batch"] == 3


@pytest.mark.parametrize(
    "name, kind",
    [
        ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
        ("triton_per_fused__to_copy_add_native_layer_norm_backward_view_7", "norm / reduce / softmax"),
        ("triton_poi_fused_gelu_gelu_backward_view_5", "elementwise / other"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("void vector_fft<256u, EPT<8u>>", "fft (fbank)"),
    ],
)
def test_profile_kinds_of_kernels(name, kind):
    assert kernel_kind(name) == kind


def test_the_step_takes_batches_of_different_rows_in_turn(shard_folder, tmp_path, one_torch_thread):
    params, folder = shard_folder
    p = tiny_train_params(params, folder, tmp_path / "unused")
    p = replace(p, train=replace(p.train, device="cpu", data=replace(p.train.data, batch_size=3)))
    step = run(p, steps=2, batches=2)["step"]
    assert (step["batches"], step["distinct_rows"]) == (2, 6)  # by default the loader makes a row per clip of every batch
    assert run(p, rows=4, steps=1, batches=2)["step"]["distinct_rows"] == 4  # fewer rows: repeated, and said so


def test_a_mixing_source_is_timed_warm_without_a_decoding_peer(mixed, shard_folder, tmp_path, one_torch_thread):
    from trainer.config import SourceParams

    params, folder = shard_folder
    _, _, events, backgrounds = mixed
    p = tiny_train_params(params, folder, tmp_path / "unused")
    source = SourceParams(kind="mixing", events=str(events), backgrounds=str(backgrounds), epoch_size=50)
    data = replace(p.train.data, sources=(source,), clusters=str(folder / "clusters"), batch_size=4)
    figures = run(replace(p, train=replace(p.train, device="cpu", data=data)), steps=1, batches=1)
    assert figures["loader"]["kind"] == "mixing" and "decode_clips_per_s" not in figures["loader"]
    assert figures["loader"]["rows"] == 4 and figures["loader"]["loader_clips_per_s"] > 0
