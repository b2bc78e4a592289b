"""The project's own tests run under one fixed hypothesis profile, whatever CI or flags say."""

from hypothesis import settings

settings.register_profile(
    "attention-conformance-project-tests",
    settings(settings.get_profile("default"), max_examples=25, derandomize=True, database=None,
             deadline=None, print_blob=False),
)
settings.load_profile("attention-conformance-project-tests")
