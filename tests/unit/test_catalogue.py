"""The catalogue of known torch-directml failures: consistent with the profiles and the fixes
it names, shown in the documentation (docs/reference/known-failures.md) as generated, and each
entry backed by a test."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from dmlpatch.gaps import catalogue, profiles, registered_ops

REPO = Path(__file__).resolve().parents[2]

#: Each entry's tests: the simulator reproduces it (without dmlpatch's fix) and, where there is
#: a fix, the result equals the CPU with it. None: not reproducible here, and why.
ENTRY_TESTS: dict[str, object] = {
    "inference-mode": [
        "tests/e2e/sim/test_sim_fidelity.py::test_inference_mode_refuses_tensors_made_outside_it",
        "tests/e2e/test_inference_mode.py::test_runner_runs_inference_mode_on_the_device",
        "tests/e2e/test_inference_mode.py::test_activation_runs_inference_mode_on_the_device",
        "tests/e2e/libraries/test_transformers_diffusers.py::test_transformers_encoder_without_dmlpatch_dies_in_inference_mode",
        "tests/e2e/libraries/test_transformers_diffusers.py::test_transformers_encoder_under_inference_mode_with_no_fallback",
    ],
    "fused-rnn-cells": [
        "tests/e2e/opfix/test_opfix_rnn.py::test_without_dmlpatch_every_recurrent_model_dies",
        "tests/e2e/opfix/test_opfix_rnn.py::test_trains_three_steps_equal_to_cpu",
    ],
    "unique-counts": [
        "tests/e2e/opfix/test_opfix_unique.py::test_refused_without_dmlpatch_and_counted_as_fixed_with_it",
        "tests/e2e/opfix/test_opfix_unique.py::test_unique2_equals_cpu",
    ],
    "unique-inverse": [
        "tests/e2e/sim/test_sim_fidelity.py::test_refusals_in_0_2_5",
        "tests/e2e/opfix/test_opfix_unique.py::test_unique2_equals_cpu",
    ],
    "avg-pool-divisor": [
        "tests/e2e/opfix/test_opfix_families.py::test_avg_pool_divisor_refused_without_dmlpatch_and_gradient",
        "tests/e2e/opfix/test_opfix_families.py::test_avg_pool_divisor_equals_cpu",
    ],
    "scatter-src-shape": [
        "tests/e2e/opfix/test_opfix_families.py::test_scatter_refused_without_dmlpatch_and_gradient",
        "tests/e2e/opfix/test_opfix_families.py::test_scatter_equals_cpu",
    ],
    "scatter-partial": [
        "tests/e2e/opfix/test_opfix_families.py::test_scatter_refused_without_dmlpatch_and_gradient",
        "tests/e2e/opfix/test_opfix_families.py::test_scatter_equals_cpu",
    ],
    "repeat-rank": [
        "tests/e2e/opfix/test_opfix_families.py::test_repeat_refused_without_dmlpatch_and_gradient",
        "tests/e2e/opfix/test_opfix_families.py::test_repeat_equals_cpu",
    ],
    "normal-1.8": ["tests/e2e/opfix/test_opfix_random_cpu_ops.py::test_normal_on_the_2022_package"],
    "step-fallbacks": [
        "tests/e2e/opfix/test_opfix_fallbacks.py::test_without_dmlpatch_directml_falls_back",
        "tests/e2e/opfix/test_opfix_fallbacks.py::test_fixed_on_device_equal_to_cpu_without_copies",
    ],
    "eye": [
        "tests/e2e/sim/test_sim_fidelity.py::test_eye_made_on_the_device_is_empty",
        "tests/e2e/opfix/test_opfix_everyday.py::test_fixed_on_device_equal_to_cpu_without_copies",
    ],
    "group-norm-backward": [
        "tests/e2e/opfix/test_opfix_everyday.py::test_without_dmlpatch_directml_falls_back",
        "tests/e2e/opfix/test_opfix_everyday.py::test_fixed_on_device_equal_to_cpu_without_copies",
        "tests/e2e/libraries/test_transformers_diffusers.py::test_diffusers_unet_without_dmlpatch_falls_back_every_step",
        "tests/e2e/libraries/test_transformers_diffusers.py::test_diffusers_unet_training_step_with_no_fallback",
    ],
    **{
        key: [
            "tests/e2e/opfix/test_opfix_everyday.py::test_without_dmlpatch_directml_falls_back",
            "tests/e2e/opfix/test_opfix_everyday.py::test_fixed_on_device_equal_to_cpu_without_copies",
        ]
        for key in (
            "isneginf",
            "var-mean",
            "cumprod",
            "logit",
            "binary-cross-entropy",
            "grid-sampler",
            "repeat-interleave",
            "count-nonzero",
            "upsample-nearest1d",
            "random-sampling",
            "embedding-bag",
        )
    },
    "antialiased-resize": [
        "tests/e2e/opfix/test_opfix_resizing.py::test_without_the_fix_directml_copies_every_resize_through_the_cpu",
        "tests/e2e/opfix/test_opfix_resizing.py::test_antialiased_resizes_equal_the_cpu_forward_and_backward",
        "tests/e2e/opfix/test_opfix_resizing.py::test_exact_nearest_resizes_equal_the_cpu_bit_for_bit",
        "tests/e2e/opfix/test_opfix_resizing.py::test_torchvision_transforms_resize_a_batch_on_the_device_as_on_the_cpu",
    ],
    "linalg": [
        "tests/e2e/opfix/test_opfix_everyday.py::test_without_dmlpatch_directml_falls_back",
        "tests/e2e/opfix/test_opfix_everyday.py::test_fixed_on_device_equal_to_cpu_without_copies",
        "tests/e2e/opfix/test_opfix_householder.py::test_q_and_r_equal_the_cpu_s",
        "tests/e2e/opfix/test_opfix_householder.py::test_householder_product_equals_the_cpu_s",
        "tests/e2e/opfix/test_opfix_cholesky.py::test_without_dmlpatch_they_fall_back",
        "tests/e2e/opfix/test_opfix_cholesky.py::test_a_multivariate_normal_trains_as_on_the_cpu",
        "tests/e2e/opfix/test_opfix_jacobi.py::test_without_dmlpatch_eigh_and_svd_fall_back",
        "tests/e2e/opfix/test_opfix_jacobi.py::test_eigh_equals_the_cpu_s",
        "tests/e2e/opfix/test_opfix_jacobi.py::test_svd_equals_the_cpu_s",
        "tests/e2e/opfix/test_opfix_exponential.py::test_orthogonal_layers_train_as_on_the_cpu",
        "tests/e2e/opfix/test_opfix_least_squares.py::test_lstsq_equals_gelsy_s",
        "tests/e2e/opfix/test_opfix_nonsymmetric.py::test_without_dmlpatch_eigvals_fails",
        "tests/e2e/opfix/test_opfix_nonsymmetric.py::test_eig_and_eigvals_give_the_cpu_s_results_through_the_cpu",
    ],
    "attention-fast-path": [
        "tests/e2e/opfix/test_opfix_attention.py::test_without_dmlpatch_the_fast_path_falls_back",
        "tests/e2e/opfix/test_opfix_attention.py::test_multihead_attention_fast_path_equals_the_cpu",
        "tests/e2e/opfix/test_opfix_attention.py::test_transformer_encoder_in_eval_equals_the_cpu",
        "tests/e2e/opfix/test_opfix_attention.py::test_masked_softmax_forward_and_backward_equal_the_cpu",
        "tests/e2e/libraries/test_vision_transformer.py::test_vit_in_eval_on_the_device_equals_the_cpu_with_no_fallback",
    ],
    "nested-tensor-encoder": [
        "tests/e2e/opfix/test_opfix_attention.py::test_nested_tensor_encoder_runs_padded_and_equals_the_cpu",
        "tests/e2e/opfix/test_opfix_attention.py::test_left_aligned_mask_check_answers_as_the_cpu",
    ],
    **{
        key: [
            "tests/e2e/opfix/test_opfix_peers.py::test_without_dmlpatch_directml_falls_back",
            "tests/e2e/opfix/test_opfix_peers.py::test_fixed_on_device_equal_to_cpu_without_copies",
        ]
        for key in ("vector-products", "elementwise-fallbacks", "std-amin", "weight-norm")
    },
    "peer-suite-fallbacks": [
        "tests/e2e/opfix/test_opfix_peers.py::test_unfixed_fallbacks_still_fall_back_and_stay_correct"
    ],
    "complex": [
        "tests/e2e/sim/test_sim_fidelity.py::test_no_bfloat16_or_complex_tensors_on_0_2_5",
        "tests/e2e/libraries/test_whisper.py::test_without_dmlpatch_a_spectrogram_on_the_device_stops",
        "tests/e2e/opfix/test_opfix_complex.py::test_without_dmlpatch_complex_tensors_stop_the_process",
        "tests/e2e/opfix/test_opfix_complex.py::test_the_fft_family_equals_the_cpu_with_no_copy",
        "tests/e2e/opfix/test_opfix_complex.py::test_stft_and_istft_round_trip_equal_the_cpu",
        "tests/e2e/opfix/test_opfix_complex.py::test_complex_operations_equal_the_cpu",
        "tests/e2e/libraries/test_type_wall.py::test_whisper_computes_its_spectrogram_on_the_device",
        "tests/e2e/libraries/test_type_wall.py::test_demucs_separates_on_the_device_as_on_the_cpu",
        "tests/e2e/libraries/test_type_wall.py::test_complex_numbers_in_a_program_of_ones_own",
    ],
    "foreach-optimizers": [
        "tests/e2e/opfix/test_opfix_foreach.py::test_without_dmlpatch_every_step_falls_back",
        "tests/e2e/opfix/test_opfix_foreach.py::test_optimizer_steps_on_the_device_equal_to_cpu",
        "tests/e2e/opfix/test_opfix_foreach.py::test_every_foreach_kernel_equals_the_cpu",
    ],
    "fused-optimizers": [
        "tests/e2e/opfix/test_opfix_foreach.py::test_without_dmlpatch_fused_steps_fall_back",
        "tests/e2e/opfix/test_opfix_foreach.py::test_optimizer_steps_on_the_device_equal_to_cpu",
        "tests/e2e/libraries/test_hf_stack.py::test_trainer_trains_three_steps_on_the_device_equal_to_cpu",
    ],
    "grad-scaler": [
        "tests/e2e/opfix/test_opfix_grad_scaling.py::test_without_dmlpatch_both_operators_fall_back",
        "tests/e2e/opfix/test_opfix_grad_scaling.py::test_a_grad_scaler_loop_equals_the_cpu_s",
    ],
    "float-times-bool": [
        "tests/e2e/sim/test_sim_fidelity.py::test_wrong_answers_of_0_2_5",
        "tests/e2e/opfix/test_opfix_quirks.py::test_without_dmlpatch_a_product_with_a_mask_is_bool",
        "tests/e2e/opfix/test_opfix_quirks.py::test_products_with_masks_equal_the_cpu",
    ],
    "cross-entropy-none-grad": [
        "tests/e2e/sim/test_sim_fidelity.py::test_wrong_answers_of_0_2_5",
        "tests/e2e/opfix/test_opfix_quirks.py::test_without_dmlpatch_cross_entropy_none_has_no_gradient",
        "tests/e2e/opfix/test_opfix_quirks.py::test_cross_entropy_none_gradients_equal_the_cpu",
    ],
    "generator": ["tests/e2e/sim/test_sim_fidelity.py::test_generator_and_seeds_of_0_2_5"],
    "manual-seed": ["tests/e2e/sim/test_sim_fidelity.py::test_generator_and_seeds_of_0_2_5"],
    "uint8-reduction": [
        "tests/e2e/sim/test_sim_fidelity.py::test_wrong_answers_of_0_2_5",
        "tests/e2e/opfix/test_opfix_quirks.py::test_without_dmlpatch_a_uint8_sum_fails_with_a_garbled_error",
        "tests/e2e/opfix/test_opfix_quirks.py::test_sums_equal_the_cpu",
    ],
    "bfloat16": [
        "tests/e2e/sim/test_sim_fidelity.py::test_no_bfloat16_or_complex_tensors_on_0_2_5",
        "tests/e2e/opfix/test_opfix_dtype_policy.py::test_without_dmlpatch_bfloat16_stops_the_process",
        "tests/e2e/opfix/test_opfix_dtype_policy.py::test_bfloat16_arrives_as_float32_with_its_values",
        "tests/e2e/opfix/test_opfix_dtype_policy.py::test_torch_load_of_a_bfloat16_checkpoint_onto_the_device",
        "tests/e2e/libraries/test_type_wall.py::test_a_bfloat16_causal_lm_loaded_every_way_generates_as_on_the_cpu",
        "tests/e2e/libraries/test_type_wall.py::test_a_bfloat16_diffusers_pipeline_samples_as_on_the_cpu",
    ],
    "half-cpu-fallback": [
        "tests/e2e/opfix/test_opfix_half_on_host.py::test_without_dmlpatch_a_float16_resize_stops",
        "tests/e2e/opfix/test_opfix_half_on_host.py::test_float16_fallbacks_without_a_cpu_kernel_run_in_float32",
    ],
    "mixed-devices-assert": None,
    "ddp-c10d": [
        "tests/e2e/test_multi_adapter.py::test_ddp_trains_two_ranks_on_two_adapters_like_one_process"
    ],
    "device-to-device": [
        "tests/e2e/sim/test_sim_fidelity.py::test_wrong_answers_of_0_2_5",
        "tests/e2e/opfix/test_opfix_quirks.py::test_copies_of_a_device_tensor_keep_pytorchs_layout",
        "tests/e2e/test_multi_adapter.py::test_data_parallel_over_two_adapters_equals_the_chunked_cpu_computation",
    ],
    "out-of-memory": None,
    "dropout-backward": ["tests/unit/test_catalogue.py::test_entries_agree_with_the_op_list"],
    "sparse-tensors": [
        "tests/e2e/sim/test_sim_fidelity.py::test_sparse_tensors_and_set_data_fail_as_on_directml",
        "tests/e2e/opfix/test_opfix_sparse.py::test_without_dmlpatch_the_move_fails",
        "tests/e2e/opfix/test_opfix_sparse.py::test_sparse_buffer_stays_on_the_cpu_as_the_model_moves",
        "tests/e2e/libraries/test_whisper.py::test_without_dmlpatch_load_model_fails_on_the_sparse_buffer",
        "tests/e2e/libraries/test_whisper.py::test_load_model_and_transcribe_on_the_device_equal_to_cpu",
    ],
    "set-data": [
        "tests/e2e/sim/test_sim_fidelity.py::test_sparse_tensors_and_set_data_fail_as_on_directml",
        "tests/e2e/yolo/test_yolo.py::test_rtdetr_repconv_fuses_on_directml",
        "tests/e2e/yolo/test_yolo.py::test_rtdetr_train_val_predict_on_directml_equal_to_cpu",
    ],
    "parameters-replaced": [
        "tests/e2e/opfix/test_opfix_module_moves.py::test_without_the_fix_the_simulator_reproduces_pytorchs_replacement",
        "tests/e2e/opfix/test_opfix_module_moves.py::test_an_optimizer_made_before_the_move_trains_as_on_the_cpu",
        "tests/e2e/libraries/test_module_moves.py::test_a_gpt2_moved_after_its_optimizer_trains_tied_as_on_the_cpu",
        "tests/e2e/libraries/test_module_moves.py::test_an_accelerate_loop_trains_as_on_the_cpu",
    ],
    "fold-unfold": [
        "tests/e2e/opfix/test_opfix_sliding_blocks.py::test_without_dmlpatch_both_fall_back",
        "tests/e2e/opfix/test_opfix_sliding_blocks.py::test_unfold_and_fold_forward_and_backward_equal_the_cpu",
        "tests/e2e/opfix/test_opfix_sliding_blocks.py::test_a_long_kernel_overlap_add_as_vocos_istft_head",
    ],
    "detection-ops": [
        "tests/e2e/opfix/test_opfix_vision.py::test_without_dmlpatch_both_fall_back",
        "tests/e2e/opfix/test_opfix_vision.py::test_nms_keeps_torchvisions_boxes_in_its_order",
        "tests/e2e/opfix/test_opfix_vision.py::test_roi_align_forward_and_backward_equal_the_cpu",
        "tests/e2e/opfix/test_opfix_vision.py::test_a_detection_step_makes_no_copy",
        "tests/e2e/opfix/test_opfix_vision.py::test_roi_pool_maxima_places_and_gradients_equal_the_cpu",
        "tests/e2e/opfix/test_opfix_vision.py::test_ps_roi_align_forward_backward_and_mapping_equal_the_cpu",
        "tests/e2e/opfix/test_opfix_vision.py::test_ps_roi_pool_means_gradients_and_mapping_equal_the_cpu",
        "tests/e2e/opfix/test_opfix_vision.py::test_deform_conv2d_and_every_gradient_equal_the_cpu",
    ],
    "torch-compile": [
        "tests/e2e/libraries/test_compile.py::test_without_dmlpatch_inductor_refuses_the_device",
        "tests/e2e/libraries/test_compile.py::test_compiled_models_train_on_the_device_as_on_the_cpu",
        "tests/e2e/libraries/test_compile.py::test_a_trainer_that_compiles_on_its_own_trains_as_on_the_cpu",
    ],
    "shared-memory": [
        "tests/e2e/opfix/test_opfix_sharing.py::test_without_dmlpatch_pytorch_refuses_with_its_own_text",
        "tests/e2e/opfix/test_opfix_sharing.py::test_a_device_tensor_handed_to_a_worker_says_why_it_stops",
        "tests/e2e/opfix/test_opfix_shared_modules.py::test_a_shared_model_trains_on_the_device_as_on_the_cpu",
        "tests/e2e/test_hogwild.py::test_one_worker_trains_as_on_the_cpu",
        "tests/e2e/test_hogwild.py::test_workers_taking_turns_read_each_others_steps",
    ],
    "autocast": [
        "tests/e2e/opfix/test_opfix_autocast.py::test_pytorch_s_autocast_lists_run_on_the_device_as_on_cuda",
        "tests/e2e/test_cuda_api.py::test_runner_answers_the_cuda_api_on_the_device",
        "tests/e2e/test_cuda_api.py::test_activation_answers_the_cuda_api_on_the_device",
        "tests/unit/test_cuda_answers.py::test_autocast_without_the_kernels_is_float32_said_once",
    ],
    "float64": [
        "tests/e2e/sim/test_sim_fidelity.py::test_float64_switch",
        "tests/e2e/libraries/test_type_wall.py::test_numpy_float64_data_on_an_adapter_without_float64",
    ],
    "scalar-writes": [
        "tests/e2e/sim/test_sim_fidelity.py::test_fault_injection_drops_scalar_writes"
    ],
    "bilinear-interpolate": None,  # no reproducing input in the report
    "autograd-device-queues": [
        "tests/e2e/test_activation.py::test_a_backward_on_the_cpu_before_the_first_cuda_site"
    ],
    "layer-norm-strided": None,  # the report gives no values to reproduce
    "meta-copy": None,  # the simulator raises as the CPU does
    "mixed-devices-1.8": [
        "tests/e2e/gfpgan/test_facexlib_0_2.py::test_module_level_device_is_rewritten"
    ],
    "torch-replaced": ["tests/e2e/test_pin.py::test_pin_keeps_torch_and_unpin_gives_pip_back"],
    "plain-linux": None,  # needs a Linux machine with torch-directml installed outside WSL2
}


def test_every_entry_has_its_tests_and_they_exist() -> None:
    assert sorted(ENTRY_TESTS) == sorted(f.key for f in catalogue.FAILURES)
    for key, tests in ENTRY_TESTS.items():
        failure = catalogue.get(key)
        if tests is None:
            assert failure.simulated in ("no", "op list"), key
            continue
        assert isinstance(tests, list)
        for test in tests:
            path, name = test.split("::")
            assert f"def {name}(" in (REPO / path).read_text(encoding="utf-8"), test


def test_entries_are_well_formed() -> None:
    keys = [f.key for f in catalogue.FAILURES]
    assert len(keys) == len(set(keys))
    for failure in catalogue.FAILURES:
        assert failure.simulated in catalogue.SIMULATED, failure.key
        assert failure.fix in catalogue.FIXES, failure.key
        assert failure.what and failure.sources and failure.remedy, failure.key
        # ATen's operators, or an operator library's own (torchvision's detection operators).
        assert all(
            op.split("::")[0] in ("aten", "torchvision") and "." not in op for op in failure.ops
        ), failure.key
        if failure.simulated == "no":
            assert failure.simulation, failure.key


def test_every_fix_names_its_module_in_the_package_of_its_kind() -> None:
    assert set(catalogue.FIXED_IN_PACKAGES) <= set(catalogue.FIXES)
    for failure in catalogue.FAILURES:
        packages = catalogue.FIXED_IN_PACKAGES.get(failure.fix)
        if packages is None:
            assert failure.fixed_in is None, failure.key
            continue
        assert failure.fixed_in is not None, failure.key
        assert any(
            failure.fixed_in == package or failure.fixed_in.startswith(package + ".")
            for package in packages
        ), failure.key
        importlib.import_module(failure.fixed_in)


def test_kernel_fixes_name_modules_that_serve_their_operators() -> None:
    for failure in catalogue.FAILURES:
        if failure.fix != "kernel":
            continue
        assert failure.fixed_in is not None, failure.key
        module = importlib.import_module(failure.fixed_in)
        served = {kernel.op for kernel in module.KERNELS}
        assert set(failure.ops) & served, failure.key


def test_quirk_entries_are_the_default_profiles_quirks() -> None:
    quirks = {f.key for f in catalogue.FAILURES if f.simulated == "quirk"}
    assert quirks == set(profiles.QUIRKS) == set(profiles.resolve().quirks)


def test_refusal_entries_have_the_profiles_texts() -> None:
    rules = {
        **{r.message: r for r in profiles.RULES_0_2_5},
        **{r.message: r for r in profiles.RULES_1_8},
    }
    for failure in catalogue.FAILURES:
        if failure.simulated != "rule":
            continue
        if failure.key == "eye":
            assert set(profiles.resolve().drops_out_resizes) == set(profiles.EYE_OUT)
            continue
        if failure.key in ("bfloat16", "complex"):
            dtype = {"bfloat16": "BFloat16", "complex": "ComplexFloat"}[failure.key]
            assert failure.text == profiles.UNSUPPORTED_DTYPE_TEXT.format(dtype=dtype)
            assert dtype in profiles.resolve().unsupported_dtypes
            continue
        said = failure.text.split(": ", 1)[1].replace("<n>", "{n}")
        if failure.key == "inference-mode":
            assert said == profiles.INFERENCE_MODE_TEXT
            assert profiles.resolve().refuses_inference_mode
            continue
        assert said in rules, failure.key
        assert rules[said].op in failure.ops, failure.key


#: Operators DirectML registers in some overloads but not in the one an entry is about:
#: ``dot.out`` but not ``dot``, number bounds but not tensor bounds, ``any`` over one dim.
NATIVE_IN_OTHER_OVERLOADS = {
    "aten::dot",
    "aten::clamp",
    "aten::clamp_min",
    "aten::clamp_max",
    "aten::any",
}


def test_entries_agree_with_the_op_list() -> None:
    native = registered_ops.native_set(registered_ops.listed_ops(), None)
    native_operators = {"aten::" + name.split(".", 1)[0] for name in native}
    for failure in catalogue.FAILURES:
        if failure.simulated == "op list":
            partly = set(failure.ops) & native_operators
            assert partly <= NATIVE_IN_OTHER_OVERLOADS, failure.key
            warned = re.search(r"operator 'aten::([\w.]+)'", failure.text)
            assert warned is None or warned.group(1) not in native, failure.key
    # Reported on earlier releases, native in 0.2.5's list: nothing to reproduce.
    assert "native_dropout_backward" in native
    assert catalogue.get("dropout-backward").simulated == "no"


@pytest.mark.parametrize(
    ("op", "how", "error", "expected"),
    [
        ("aten::_unique2", "fixed", None, "unique-counts/unique-inverse"),
        (
            "aten::_unique2",
            "refused",
            "Return inverse not implemented for unique operator for DirectML.",
            "unique-inverse",
        ),
        (
            "aten::addmm",
            "refused",
            "Cannot set version_counter for inference tensor",
            "inference-mode",
        ),
        (
            "aten::repeat",
            "refused",
            "the dimesion of at::Tensor must be 4 or lower, but got 6",
            "repeat-rank",
        ),
        ("aten::lerp.Scalar_out", "fixed", None, "step-fallbacks"),
        ("aten::isneginf.out", "fallback", None, "isneginf"),
        ("aten::_thnn_fused_gru_cell", "fixed", None, "fused-rnn-cells"),
        ("aten::_foreach_sqrt", "fixed", None, "foreach-optimizers"),
        ("aten::_foreach_addcdiv_.ScalarList", "fallback", None, "foreach-optimizers"),
        ("aten::hypot.out", "fallback", None, ""),
        ("aten::mul.out", "fixed", None, "float-times-bool"),
        ("aten::nll_loss_backward.grad_input", "fixed", None, "cross-entropy-none-grad"),
        (
            "aten::sum.IntList_out",
            "refused",
            "'utf-8' codec can't decode byte 0xcf in position 0: invalid continuation byte",
            "uint8-reduction",
        ),
        (
            "aten::empty.memory_format",
            "refused",
            "Invalid or unsupported data type BFloat16.",
            "bfloat16",
        ),
        ("aten::_to_copy", "fixed", None, "device-to-device"),
        (
            "aten::mul.out",
            "refused",
            "0 <= device.index() && device.index() < static_cast<c10::DeviceIndex>(device_ready_"
            "queues_.size()) INTERNAL ASSERT FAILED at engine.cpp:1634",
            "autograd-device-queues",
        ),
        ("aten::mul.out", "refused", "0 is not a valid index", "float-times-bool"),
    ],
)
def test_check_rows_name_their_entry(op: str, how: str, error: object, expected: str) -> None:
    found = catalogue.for_gap(op, how, error if isinstance(error, str) else None)
    assert "/".join(f.key for f in found) == expected


def test_the_docs_show_the_catalogue_as_generated() -> None:
    page = (REPO / "docs" / "reference" / "known-failures.md").read_text(encoding="utf-8")
    assert catalogue.table(markdown=True) in page


def test_summary_counts() -> None:
    line = catalogue.summary()
    assert line.startswith(f"{len(catalogue.FAILURES)} known torch-directml failures: ")


def test_every_text_names_its_entry_from_an_error() -> None:
    for failure in catalogue.FAILURES:
        if not failure.text:
            continue
        said = re.sub(r"<[a-z]+>", "5", failure.text).replace("...", "/lib/x")
        found = catalogue.for_error(said)
        assert found is not None and found.key == failure.key, (failure.key, said)
        # Quoted inside a longer line (doctor's probes wrap what they caught).
        quoted = catalogue.for_error(f"it failed ({said}); see above")
        assert quoted is not None and quoted.key == failure.key
    assert catalogue.for_error("RuntimeError: Expected all tensors on the same device") is None
    assert catalogue.for_error("RuntimeError: Invalid or unsupported data type Float.") is None
    assert catalogue.for_error("") is None
