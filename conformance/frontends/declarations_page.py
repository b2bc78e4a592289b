"""The docs' reference page of every declaration, rendered from the table
(:mod:`conformance.model.declaration_specs`): ``python -m conformance.frontends.declarations_page
> docs/declarations.md`` (a test keeps the page current)."""

from __future__ import annotations

from conformance.model.declaration_specs import SPECS, Form


def reference_table() -> str:
    """The docs' reference table of every declaration (``docs/declarations.md``)."""
    lines = ["# Declarations", "",
             "What a declaration overrides of inference, item by item. The same names everywhere:",
             "`--FLAG` on the command line, `--attention-declare NAME=VALUE` in pytest,",
             "`[tool.attention-conformance.declare.\"IMPL\"]` in `pyproject.toml`, a rubric's",
             "`interface = {...}`, and `declare={...}` in Python. This page is generated from",
             "`conformance/model/declaration_specs.py` (`python -m",
             "conformance.frontends.declarations_page > docs/declarations.md`); a test keeps it so.",
             "", "| name (TOML, pytest) | flag | value | what it declares |",
             "| --- | --- | --- | --- |"]
    for spec in SPECS:
        flag = spec.flag + ("" if spec.form is Form.SWITCH else f" {spec.grammar.split(' ')[0]}")
        value = spec.grammar.replace("|", "\\|")
        lines.append(f"| `{spec.key}` | `{flag}` | `{value}` | {spec.help} |")
    return "\n".join(lines) + "\n"


def main() -> None:  # pragma: no cover - writes the docs page
    print(reference_table(), end="")


if __name__ == "__main__":  # pragma: no cover
    main()
