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


@pytest.mark.parametrize("name, kind", [
    ("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ("triton_per_fused__to_copy_add_native_layer_norm_backward_view_7", "norm / reduce / softmax"),
    ("triton_poi_fused_gelu_gelu_backward_view_5", "elementwise / other"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("void vector_fft<256u, EPT<8u>>", "fft (fbank)"),
])
def test_profile_kinds_of_kernels(name, kind):
    assert kernel_kind(name) == kind
