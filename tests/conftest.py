"""The tests in three tiers, each file in one (a marker on every test in it):

- ``unit``: one module's behaviour on data made in the test (tolerances, the reference, weight
  layouts, masks, rubrics, scoring, the codec, the package's shape); seconds in all.
- ``integration``: the catalogue, inference, the worker or a front end on a few implementations.
- ``e2e``: whole runs as users make them, over many implementations: the expected-results matrix
  and the mutant zoo, inference on every bundled class, the collections through the command line,
  hostile and crashing submissions, the example class graded. These are also ``slow``, but for
  the whole-catalogue proofs' tests about one bundled implementation of the sample that keeps
  every form (``tests/sample.py``): those are ``sampled`` instead.

``make test`` runs ``-m "not slow"``: unit, integration and the sample (at most 6 minutes on two
cores, from a fresh clone); ``make test-all`` runs everything (what ``.ci/run`` runs); ``-m unit``
is the quickest. A file missing below is an error, so a new one gets a tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sample import bundled_sample

UNIT = {
    "test_architecture", "test_grading_inputs", "test_grading_outputs", "test_grading_rubric",
    "test_grading_scoring", "test_grading_student_text", "test_grading_variants",
    "test_front_end_words", "test_masks_and_cases", "test_platform_defects", "test_reference",
    "test_run_options",
    "test_suite_errors", "test_hint_evidence", "test_declaration_specs", "test_remedies",
    "test_tolerance", "test_attention_core", "test_errors", "test_search_replays",
    "test_weights", "test_worker_codec", "test_worker_pristine", "test_capability_groups",
    "test_input_writes",
}
INTEGRATION = {
    "test_behaviour_inference", "test_bench", "test_example_database", "test_causal_hints", "test_cli",
    "test_command_exit",
    "test_kv_cache_hints", "test_context_argument",
    "test_declaration_parity", "test_declarations", "test_grading_execution",
    "test_grading_environment", "test_grading_printed_output",
    "test_homework_styles_are_correct", "test_library_caches_are_correct",
    "test_library_others_are_correct", "test_library_transformers_are_correct", "test_modern",
    "test_modern_styles_are_correct", "test_pytest_plugin", "test_real_layer_causes", "test_runner",
    "test_kernels", "test_malformed_outputs", "test_bad_input_fuzzer", "test_malformed_collection",
    "test_time_budget", "test_shared_checks", "test_reports",
    "test_user_pytest",
    "test_wild_styles_are_correct", "test_docs_examples", "test_new_architectures_are_correct",
    "test_new_architectures", "test_new_designs_are_correct", "test_new_designs", "test_chunked",
    "test_logit_scale", "test_padded_rows", "test_core_reference", "test_fixed_length",
    "test_interface_function", "test_models",
    "test_library_held_out", "test_tiers", "test_triton_kernel",
    "test_gpu_acceptance", "test_gpu_worker", "test_kv_cache_assignment", "test_serve",
    "test_refused_lengths", "test_readme_example", "test_messages",
    "test_model_attention_functions",
}
E2E = {
    "test_containment", "test_expected_results", "test_grading_cli", "test_grading_example",
    "test_grading_shards", "test_inference", "test_library_layers", "test_no_false_alarms",
    "test_thirdparty", "test_wheel", "test_worker", "test_worker_hostile", "test_watch",
    "test_routes_and_profiles",
}
MOVED_TO_SLOW = {
    ("test_new_architectures", "checked"):
        "infers and checks thirty hand-written layers of new architectures at once (a minute of "
        "one core); their float64 oracle proofs stay in make test",
    ("test_new_designs", "checked"):
        "infers and checks the new designs' layers and twins at once (half a minute of one core); "
        "their float64 oracle proofs stay in make test",
    ("test_interface_function", "checked"):
        "infers and checks seven attention functions in AttentionInterface's form at once (a "
        "minute of one core); how the form is told and called stays in make test",
    ("test_models", "checked"):
        "builds three transformers models and checks each one's attention through it (a minute "
        "and a half of one core); finding and driving the layers stays in make test",
    ("test_model_attention_functions", "checked"):
        "builds nine transformers models with a registered attention function and its three "
        "twins and checks each (ten minutes of one core); how the function is registered "
        "stays in make test",
    ("test_model_attention_functions", "cached_decoding"):
        "builds Llama and BART with a correct attention function and one that keeps as many keys "
        "as queries, and decodes each through the model's own cache (a minute of one core)",
    ("test_real_layer_causes", "checked"):
        "infers and checks every real-layer cause's layer and twin at once (half a minute of one "
        "core); the proofs of those layers stay in make test",
}
"""Integration tests in the slow tier, by (file, the fixture that makes them slow), each with why:
``make test`` stays within 6 minutes."""
TIERS = {**dict.fromkeys(UNIT, "unit"), **dict.fromkeys(INTEGRATION, "integration"),
         **dict.fromkeys(E2E, "e2e")}


LONGEST_FIRST = (
    "test_expected_results", "test_inference", "test_no_false_alarms", "test_grading_example",
    "test_library_layers", "test_real_layer_causes", "test_user_pytest", "test_pytest_plugin",
    "test_grading_cli", "test_containment", "test_reports", "test_worker_hostile", "test_wheel",
    "test_declaration_parity",
)
"""The files that take longest (``--durations``), started first: ``make test`` runs a file per
xdist worker at a time (``--dist loadfile``), and a long file started last would run alone while
the other core idles."""


def _started_first(item: pytest.Item) -> int:
    stem = Path(str(item.fspath)).stem
    return LONGEST_FIRST.index(stem) if stem in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_started_first)  # stable: the order within a file and among the rest stays
    for item in items:
        stem = Path(str(item.fspath)).stem
        if Path(str(item.fspath)).parent != Path(__file__).parent:
            continue  # a test file written by a test (pytester), not one of ours
        tier = TIERS.get(stem)
        if tier is None:
            raise pytest.UsageError(f"{stem}.py has no tier: add it to tests/conftest.py")
        item.add_marker(tier)
        for (file, fixture), why in MOVED_TO_SLOW.items():
            if stem == file and fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.slow(why=why))
        if tier != "e2e":
            continue
        about = _implementation(item)
        if about is not None and about in bundled_sample():
            item.add_marker("sampled")
        else:
            item.add_marker("slow")


def _implementation(item: pytest.Item) -> str | None:
    """The bundled implementation a parametrized test is about (its ``name``, or its mutant
    ``module``'s), else None."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("name"), str):
        return params["name"]
    implementation = getattr(params.get("module"), "IMPLEMENTATION", None)
    return getattr(implementation, "name", None)
