"""The collections' correct layers through the second route and the second profile (issue 55):

- ``scale`` through the attention core (``--weights none``: q and k judged where they meet, at
  every head width generated, 1 included) agrees with ``scale`` through the weights, which
  passes every one of them (``tests/test_no_false_alarms.py``): no layer fails it, every layer
  it judges passes, and layer by layer the two routes give the same verdict;
- the whole output of the thorough profile over every collection holds to the message rules
  (``tests/message_rules.py``) as the quick profile's does, and exits 0.
"""

from __future__ import annotations

import json

import pytest

from conformance.frontends.cli import main
from tests.message_rules import problems
from tests.test_no_false_alarms import SPECS


def _run(tmp_path, *arguments: str) -> tuple[int, dict]:
    path = tmp_path / "report.json"
    code = main(["check", *arguments, "--jobs", "2", "--no-isolate", "--json", str(path)])
    return code, json.loads(path.read_text())


@pytest.fixture(scope="module")
def through_the_core(tmp_path_factory) -> tuple[int, dict]:
    return _run(tmp_path_factory.mktemp("core"), *SPECS, "--check", "scale", "--weights", "none")


def test_scale_through_the_core_fails_no_correct_layer(through_the_core):
    code, payload = through_the_core
    failures = [f"{r['implementation']}: {r['reason']}" for r in payload["results"]
                if r["status"] == "failed"]
    # Exit 2 (nothing checked) where the core route can't judge a layer's scale: its only
    # check, skipped; never 1.
    assert failures == [] and code in (0, 2)


@pytest.fixture(scope="module")
def by_default(tmp_path_factory) -> tuple[int, dict]:
    return _run(tmp_path_factory.mktemp("default"), *SPECS, "--check", "scale")


def test_the_two_routes_give_each_layer_the_same_verdict(through_the_core, by_default):
    """Layer by layer: where both routes judge a layer's scale (neither skips), their verdicts
    are the same (passed, or a warning about intent)."""
    verdicts = [{r["implementation"]: r["status"] for r in payload["results"]
                 if r["check"] == "scale" and r["status"] != "skipped"}
                for _, payload in (through_the_core, by_default)]
    both = sorted(set(verdicts[0]) & set(verdicts[1]))
    assert len(both) >= len(SPECS) // 2
    assert {name: (verdicts[0][name], verdicts[1][name]) for name in both
            if verdicts[0][name] != verdicts[1][name]} == {}


def test_scale_through_the_core_judges_most_layers_at_their_core(through_the_core):
    """Agreement that means something: the core route ran, not a skip in its place."""
    _, payload = through_the_core
    judged = [r for r in payload["results"] if r["check"] == "scale"
              and r["status"] in ("passed", "warning")]
    assert all(r["route"] == "core" for r in judged)
    assert len(judged) >= len(SPECS) * 2 // 3, [r["implementation"] for r in payload["results"]
                                                if r["status"] == "skipped"]


def test_the_thorough_profile_says_every_message_once_and_whole(tmp_path):
    """Every collection's correct layers (the four of tests/test_no_false_alarms.py), in the
    profile that searches longest: no false alarm, and every message once and whole (eight
    minutes of two cores)."""
    code, payload = _run(tmp_path, *SPECS, "--profile", "thorough")
    assert problems(payload) == []
    assert code == 0
