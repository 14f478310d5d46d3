"""A stage's refusal to write the optimized model: the message and the report sections that say
why, which the orchestrator (pipeline.py) places in the report before it raises ValidationError
with it (exit code 3): stages hand their sections back rather than writing a shared report."""

from __future__ import annotations

from ..report.types import InvalidModel, Precision, Validation


class Refused(Exception):
    """The optimized graph fails a check (validation, or the half-precision bound): `message`
    says so in the user's terms; the sections are the report's, as far as the check went."""

    def __init__(
        self,
        message: str,
        *,
        validation: Validation | InvalidModel | None = None,
        precision: Precision | None = None,
        made_up_inputs: str | None = None,
    ):
        super().__init__(message)
        self.validation = validation
        self.precision = precision
        self.made_up_inputs = made_up_inputs
