"""The SMELT paper's reference values (section 6), in one place: the probes' summaries, the
figures' shaded bands, the dashboard's captions and the notebooks all read them from here, so
they are set beside our measurements and never retyped.

Each value is a `Reference`: a range (lo..hi), or for the Dyck case study a first-visit and a
second-visit value. `str()` gives the form shown in text ("0.89-0.93", "56-66%",
"0.60 -> 0.02"); `table_text()` and `at_visit()` the forms set beside a probe's numbers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reference:
    """A published value: the range [lo, hi] (lo == hi for a point), or with `arrow` the
    change from visit 0 (lo) to visit 1 (hi)."""

    lo: float
    hi: float
    arrow: bool = False
    unit: str = ""

    def __str__(self) -> str:
        if self.arrow:
            return f"{self.lo:.2f} -> {self.hi:.2f}"
        if self.unit == "%":
            return f"{100 * self.lo:.0f}-{100 * self.hi:.0f}%"
        if self.lo == self.hi:
            return f"{self.lo:g}{self.unit}"
        return f"{self.lo:g}-{self.hi:g}{self.unit}"

    def table_text(self) -> str:
        """The form in a probe's summary, in the units of the measured column: a share as a
        fraction ("0.56-0.66", the column holds 0..1), anything else as `str()`."""
        return f"{self.lo:g}-{self.hi:g}" if self.unit == "%" else str(self)

    def at_visit(self, visit: int) -> str:
        """For a visit-0 -> visit-1 value: the value at `visit` ("0.60"); '' for other visits."""
        return f"{(self.lo, self.hi)[visit]:.2f}" if self.arrow and visit in (0, 1) else ""


# Experts shared by the two visits' top-k sets, out of k = 8 (E = 64 in the paper's models).
ROUTING_OVERLAP = Reference(2, 3, unit=" of 8")
ROUTING_K = 8

# Cosine between visit 0 and visit 1, per token and head.
COS_Q = Reference(0.89, 0.93)
COS_K = Reference(0.89, 0.93)
COS_V = Reference(0.65, 0.74)

# Share of the 8 most attended keys the two visits have in common; control: layer l vs l + 1.
TOP8_OVERLAP = Reference(0.56, 0.66, unit="%")
TOP8_OVERLAP_CONTROL = Reference(0.28, 0.34, unit="%")

# Dyck case study: attention mass from the answer positions, first visit -> second visit.
DYCK_BOS_MASS = Reference(0.60, 0.02, arrow=True)
DYCK_DEMO_MASS = Reference(0.24, 0.85, arrow=True)

# Similarity statistics by probe column, for tables and shaded figure bands.
SIMILARITY = {"cos_q": COS_Q, "cos_k": COS_K, "cos_v": COS_V, "top8_overlap": TOP8_OVERLAP}
SIMILARITY_CONTROL = {"top8_overlap": TOP8_OVERLAP_CONTROL}
DYCK = {"bos_mass": DYCK_BOS_MASS, "demo_mass": DYCK_DEMO_MASS}
