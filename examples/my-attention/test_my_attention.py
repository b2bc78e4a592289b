"""The README's pytest example: one test per check, `pytest test_my_attention.py` from this
folder (its scale test fails: my_attention.py's bug)."""

from my_attention import MyAttention

from conformance.testing import parametrize_with_checks


@parametrize_with_checks(MyAttention)    # or declare={"causal": "always"}, expected_failures=...
def test_my_attention(attention_check):
    attention_check()
