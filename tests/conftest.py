"""The tests in three tiers, each file in one (a marker on every test in it):

- ``unit``: one module's behaviour on data made in the test (tolerances, the reference, weight
  layouts, masks, rubrics, scoring, the codec, the package's shape); seconds in all.
- ``integration``: the catalogue, inference, the worker or a front end on a few implementations.
- ``e2e``: whole runs as users make them, over many implementations: the expected-results matrix
  and the mutant zoo, inference on every bundled class, the collections through the command line,
  hostile and crashing submissions, the example class graded. These are also ``slow``, but for
  the whole-catalogue proofs' tests about one bundled implementation of the sample that keeps
  every form (``tests/sample.py``): those are ``sampled`` instead.

``make test`` runs ``-m "not slow"``: unit, integration and the sample (aimed at 6 minutes on two
cores, from a fresh clone: docs/measurements.md says what it takes); ``make test-all`` runs
everything (what ``.ci/run`` runs); ``-m unit`` is the quickest. A file missing below is an
error, so a new one gets a tier.
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
    "test_input_writes", "test_normaliser", "test_partly_judged",
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
    "test_model_attention_functions", "test_courses", "test_forward_paths",
    "test_structural_leaks", "test_operators",
}
E2E = {
    "test_containment", "test_expected_results", "test_grading_cli", "test_grading_example",
    "test_grading_shards", "test_inference", "test_library_layers", "test_no_false_alarms",
    "test_thirdparty", "test_wheel", "test_worker", "test_worker_hostile", "test_watch",
    "test_routes_and_profiles", "test_grading_conventions",
}
MOVED_TO_SLOW = {
    ("test_operators", "checked"):
        "checks the operators and their twins at once (about a minute of one core); how each "
        "normaliser is observed and named, and each setting followed, stays in make test",
    ("test_courses", "checked"):
        "infers and checks the six courses' forms and their students' twins at once (a minute of "
        "one core); how each form is built and called (config objects, valid lengths, widths by "
        "behaviour) stays in make test",
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
    ("test_triton_kernel", "test_checked_bare_it_passes_and_its_twin_fails_reference"):
        "runs the whole catalogue on the Triton kernel and its twin under Triton's interpreter "
        "(a minute); the kernel against its float64 oracle and the twin's wrong last block stay "
        "in make test",
    ("test_kv_cache_assignment", "graded"):
        "grades the KV-cache assignment's example class in the sandboxed worker (most of a "
        "minute); grading a class through the worker stays in make test (test_grading_execution)",
    ("test_kv_cache_assignment", "test_the_self_test_exercises_every_item_of_a_causal_cached_rubric"):
        "runs the grader's self-test, every mutant, on the causal cached rubric (forty seconds)",
    ("test_gpu_acceptance",
     "test_the_acceptance_driver_on_the_cpu_passes_the_kernel_fails_the_twin_and_says_nowhere"):
        "runs the GPU acceptance driver's CPU half whole (forty seconds); the script's own test "
        "stays in make test",
    ("test_shared_checks",
     "test_an_isolated_implementation_gets_a_twin_worker_and_leaves_nothing_behind"):
        "checks a whole catalogue in a sandboxed worker and its twin (25 s); sharing checks out "
        "over two processes stays in make test",
    ("test_shared_checks", "test_a_fork_that_dies_leaves_its_check_to_this_process"):
        "waits for a killed fork and runs its check again here (15 s)",
    ("test_shared_checks", "test_with_a_second_thread_no_fork_is_made"):
        "a whole catalogue with a second thread running (10 s)",
    ("test_shared_checks", "test_two_processes_give_what_one_gives[mutant-dropout-in-eval]"):
        "a second implementation's catalogue in one process and in two (10 s); the first one's "
        "stays in make test",
    ("test_user_pytest", "test_every_failing_id_pasted_back_reruns_that_test"):
        "runs pytest on a user's file once per failing id (20 s)",
    ("test_user_pytest", "test_xdist_and_junitxml"):
        "runs a user's pytest under xdist (15 s); the plugin in one process stays in make test",
    ("test_pytest_plugin", "test_hypothesis_options_reach_the_suites_searches"):
        "runs pytest three times with hypothesis' options (20 s)",
    ("test_pytest_plugin", "test_a_falsifying_example_replays_from_its_one_line"):
        "runs pytest twice, the second time replaying a falsifying example (15 s)",
    ("test_pytest_plugin", "test_profiles_hold_under_ci_and_foreign_hypothesis_profiles"):
        "runs pytest under three hypothesis profiles (12 s)",
    ("test_serve", "test_a_served_check_says_and_exits_what_a_cold_one_does"):
        "checks one file served and cold, and compares (20 s); the server's other tests stay in "
        "make test",
    ("test_reports", "test_pytest_writes_the_page_from_its_workers"):
        "runs a user's pytest under xdist writing the page (17 s); the page itself stays in make "
        "test",
    ("test_kernels", "test_a_half_only_kernel_is_checked_in_half_precision_and_passes"):
        "a whole catalogue in float16 and bfloat16 on a CPU (20 s)",
    ("test_kernels", "test_a_base2_lse_is_a_warning_and_a_top_left_kernel_passes"):
        "two kernels' whole catalogues (10 s)",
    ("test_kernels", "test_the_flash_layout_kernel_passes_with_nothing_declared"):
        "a whole catalogue on a half-precision kernel in FlashAttention's layout (10 s)",
    ("test_malformed_collection", "test_every_entry_gets_a_verdict_naming_its_problem[Slow]"):
        "waits for a slow module's time limit (13 s)",
    ("test_bad_input_fuzzer",
     "test_every_malformed_module_gets_a_plain_verdict_never_a_suite_error"):
        "generates and checks malformed modules (20 s); the malformed collection stays in make "
        "test",
    ("test_cli", "test_matrix_failure_block_and_summary"):
        "the command line's matrix over several implementations (15 s)",
    ("test_declaration_parity",
     "test_the_same_declaration_gives_the_same_verdicts_wherever_it_is_made"):
        "one declaration made five ways, two of them through pytest runs (15 s); how each way is "
        "read stays in make test (test_declarations)",
}
"""Integration tests in the slow tier, by (file, the fixture or the test that makes them slow,
a parametrized test by its id), each with why: they keep ``make test`` near its 6 minutes
(measured in docs/measurements.md)."""
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
        names = {*getattr(item, "fixturenames", ()), item.name, getattr(item, "originalname", "")}
        for (file, name), why in MOVED_TO_SLOW.items():
            if stem == file and name in names:
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
