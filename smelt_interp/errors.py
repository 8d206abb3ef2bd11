"""The package's exception types: one base class so commands can turn any of them into a
one-line message and exit code 2 instead of a traceback."""

from __future__ import annotations


class SmeltError(Exception):
    """Base class of every error smelt-interp reports to a user."""


class ConfigError(SmeltError, ValueError):
    """An impossible model or training configuration; the message names the field."""


class CheckpointError(SmeltError):
    """A checkpoint file that is missing, corrupt, foreign or unsafe; the message names the file."""


class DataError(SmeltError):
    """Unreadable or unusable data: a missing path, an empty corpus, a non-UTF-8 file."""


class TokenizerError(DataError, ValueError):
    """Text the tokenizer cannot encode, or token ids it cannot decode."""


class TokenError(DataError, ValueError):
    """Tokens a model cannot run on: not an integer [batch, pos] tensor, an id outside its
    vocabulary, or more positions than its max_seq_len."""


class MatchError(SmeltError):
    """A Baseline for which the budget matcher finds no SMELT config within tolerance."""


class ProbeError(SmeltError):
    """A probe asked of a model that cannot answer it (e.g. two visits of an unlooped model)."""


class RunsError(DataError, ValueError):
    """A runs table the scaling fit cannot use; the message names the column or count at fault."""


class FitError(SmeltError, ValueError):
    """A fit or frontier that cannot be computed (no convergence, no interior optimum)."""


class TrainingDiverged(SmeltError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class PromptError(SmeltError):
    """A dashboard prompt the page cannot use; the message is shown on the page as is."""


class CallbackInputError(SmeltError):
    """A dashboard callback value the page never sends (wrong type, out of range, too long);
    the page answers with this message instead of running the callback."""


class RunFolderError(SmeltError):
    """A training output folder that cannot be used: a plain file (or under one), unwritable, or
    held by another training run."""


class ResultsError(DataError):
    """A results file that is missing, lacks its header lines or lacks a named table."""
