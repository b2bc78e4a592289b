"""The class roster (``--roster CSV``): who the ids are, and who did not submit.

A CSV with a header row. Columns are recognised by name, case and spaces aside:

- ids (any of them may match a submission's id): ``id``, ``student_id``, ``user_id``,
  ``userid``, ``sis_user_id``, ``participant_id``, ``login``, ``login_id``, ``username``,
  ``github_username``, ``identifier``, ``roster_identifier``;
- the name: ``name``, ``full_name``, ``student``, ``student_name``, or ``first_name`` and
  ``last_name``;
- ``email`` (or ``email_address``).

A GitHub Classroom roster (``identifier, github_username, github_id, name``) and a Canvas or
Moodle export both work as they are.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from conformance.errors import ConformanceError

ID_COLUMNS = ("id", "student_id", "user_id", "userid", "sis_user_id", "participant_id",
              "login", "login_id", "username", "github_username", "identifier",
              "roster_identifier")
NAME_COLUMNS = ("name", "full_name", "student", "student_name")


class RosterError(ConformanceError):
    """A roster that can't be read; one line."""


@dataclass(frozen=True)
class Person:
    """One roster row."""

    ids: tuple[str, ...]
    name: str = ""
    email: str = ""
    identifier: str = ""
    """The GitHub Classroom ``identifier`` column, when there is one."""


@dataclass
class Roster:
    people: list[Person] = field(default_factory=list)

    @property
    def has_email(self) -> bool:
        return any(person.email for person in self.people)

    def find(self, student: str) -> Person | None:
        """The person one of whose ids is ``student`` (case-insensitively)."""
        wanted = student.casefold()
        for person in self.people:
            if any(i.casefold() == wanted for i in person.ids):
                return person
        return None


def _key(column: str) -> str:
    return column.strip().lower().replace(" ", "_").replace("-", "_")


def load(path: Path) -> Roster:
    """Read the roster at ``path``. Raises RosterError (one line)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise RosterError(f"roster {path}: cannot read it ({error})") from None
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise RosterError(f"roster {path}: no rows under a header")
    columns = {_key(c): c for c in rows[0] if c is not None}
    id_columns = [columns[c] for c in ID_COLUMNS if c in columns]
    if not id_columns:
        raise RosterError(f"roster {path}: no id column (one of {', '.join(ID_COLUMNS)})")
    name_column = next((columns[c] for c in NAME_COLUMNS if c in columns), None)
    email_column = columns.get("email") or columns.get("email_address")
    roster = Roster()
    for row in rows:
        ids = tuple(dict.fromkeys(str(row.get(c) or "").strip() for c in id_columns
                                  if str(row.get(c) or "").strip()))
        if not ids:
            continue
        if name_column:
            name = str(row.get(name_column) or "").strip()
        else:
            first = str(row.get(columns.get("first_name", ""), "") or "").strip()
            last = str(row.get(columns.get("last_name", ""), "") or "").strip()
            name = f"{first} {last}".strip()
        identifier = str(row.get(columns.get("identifier", ""), "") or "").strip()
        roster.people.append(Person(ids, name,
                                    str(row.get(email_column) or "").strip() if email_column
                                    else "", identifier))
    return roster
