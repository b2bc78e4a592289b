"""The ``transformers`` model classes a pattern names (``transformers:*ForCausalLM``), each a
target of its own by its class name: the library's own lists of its causal LMs, base models,
encoder-decoders, masked LMs and image classifiers (its auto classes' mappings), matched with
shell-style wildcards."""

from __future__ import annotations

import fnmatch

from conformance.model.target_spec import TargetSpec

PREFIX = "transformers:"

MAPPINGS = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_MAPPING_NAMES",
            "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
            "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES")
"""The auto classes' mappings whose class names a pattern is matched against."""


def is_pattern(spec: str) -> bool:
    """Whether ``spec`` names ``transformers`` model classes by a wildcard pattern."""
    return spec.startswith(PREFIX) and TargetSpec.parse(spec).pattern


def model_names(spec: str) -> list[str]:
    """The targets (``transformers:ClassName``) the pattern ``spec`` names, sorted; empty where
    it names none, or ``transformers`` is not installed."""
    try:
        from transformers.models.auto import modeling_auto
    except ImportError:
        return []
    names: set[str] = set()
    for mapping in MAPPINGS:
        for value in getattr(modeling_auto, mapping, {}).values():
            names.update(value if isinstance(value, (tuple, list)) else (value,))
    pattern = spec[len(PREFIX):]
    return [PREFIX + name for name in sorted(names) if fnmatch.fnmatchcase(name, pattern)]
