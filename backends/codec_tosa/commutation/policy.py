"""Policies: an ordered set of letters; a policy selects every variant at or below it."""

from __future__ import annotations

from dataclasses import dataclass

# V and I are the integer-target policies (docs/DESIGN.md, "Policy"): V adds the
# operators that commute exactly with an affine codec, I everything Arm lowers in INT8.
DEFAULT_ORDER: tuple[str, ...] = ("Z", "Y", "X", "W", "V", "I")
# The policy whose artefacts are all-integer TOSA (TOSA-1.0+INT, Ethos-U).
INTEGER_POLICY = "I"


@dataclass(frozen=True)
class PolicyOrder:
    """The ordered policy letters, least compressed first (Z < Y < X < W < V < I by default)."""

    letters: tuple[str, ...] = DEFAULT_ORDER

    def __post_init__(self) -> None:
        if not self.letters or len(set(self.letters)) != len(self.letters):
            raise ValueError(f"policy order {self.letters!r}: needs distinct letters")

    def rank(self, policy: str) -> int:
        try:
            return self.letters.index(policy)
        except ValueError:
            raise ValueError(
                f"unknown policy {policy!r}: expected one of {', '.join(self.letters)}"
            ) from None

    def selects(self, policy: str, first_policy: str | None) -> bool:
        """True when `policy` selects a variant first selected by `first_policy`."""
        return first_policy is not None and self.rank(first_policy) <= self.rank(policy)

    @property
    def reference(self) -> str:
        """The least compressed policy (no codecs at all)."""
        return self.letters[0]
