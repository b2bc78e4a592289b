"""Realistic broken implementations, each a bug people ship, kept to prove the checks catch them.

Every mutant module documents its bug, the symptom, and in ``CATCHES`` the check that must fail.
Each subclasses the correct :mod:`implementations.mutants.textbook` attention and overrides only
the step its bug lives in.
"""

from __future__ import annotations

from types import ModuleType

from implementations.mutants import (
    batch_heads_mixed,
    bool_mask_inverted,
    causal_hides_current_token,
    causal_shows_next_token,
    custom_softmax_backward,
    detached_projection,
    dropout_in_eval,
    dropout_on_logits,
    dropout_without_rescaling,
    encoder_with_causal_mask,
    exp_without_max,
    fill_minus_1e9,
    heads_merged_without_transpose,
    heads_view_no_transpose,
    in_place_input,
    inference_path_unscaled,
    kv_with_q_length,
    mask_after_softmax,
    mask_dtype_promotes,
    mask_first_head_only,
    mask_inverted,
    mask_required,
    norm_without_dim,
    output_projection_skipped,
    same_projection_for_k_and_v,
    scale_applied_twice,
    scale_missing,
    scale_sqrt_d_model,
    softmax_query_axis,
)

MUTANT_MODULES: tuple[ModuleType, ...] = (
    batch_heads_mixed,
    bool_mask_inverted,
    causal_hides_current_token,
    causal_shows_next_token,
    custom_softmax_backward,
    detached_projection,
    dropout_in_eval,
    dropout_on_logits,
    dropout_without_rescaling,
    encoder_with_causal_mask,
    exp_without_max,
    fill_minus_1e9,
    heads_merged_without_transpose,
    heads_view_no_transpose,
    in_place_input,
    inference_path_unscaled,
    kv_with_q_length,
    mask_after_softmax,
    mask_dtype_promotes,
    mask_first_head_only,
    mask_inverted,
    mask_required,
    norm_without_dim,
    output_projection_skipped,
    same_projection_for_k_and_v,
    scale_applied_twice,
    scale_missing,
    scale_sqrt_d_model,
    softmax_query_axis,
)
