"""The exceptions sparsedp raises.

Every error is a :class:`SparseDPError`, itself a :class:`ValueError`, so callers may catch either.
Bad input is rejected *before* any noise is drawn and before any privacy budget is spent.
"""

from __future__ import annotations

__all__ = [
    "SparseDPError",
    "ShapeError",
    "NonFiniteInputError",
    "InvalidPrivacyParameterError",
    "BudgetExceededError",
    "NegativeCountError",
    "FractionalCountError",
    "InfeasibleConstraintsError",
    "UnsupportedStructureError",
    "InputBoundError",
    "UnsafeFileError",
    "ReleaseExistsError",
]


class SparseDPError(ValueError):
    """Root of every error raised by sparsedp."""


class ShapeError(SparseDPError):
    """An array or operator has the wrong shape for the operation."""


class NonFiniteInputError(SparseDPError):
    """Input contains NaN or infinity."""


class InvalidPrivacyParameterError(SparseDPError):
    """A privacy parameter is out of range (epsilon <= 0, delta outside (0, 1), rho <= 0, ...)."""


class BudgetExceededError(SparseDPError):
    """A measurement would spend more privacy budget than is left. Nothing was spent."""


class NegativeCountError(SparseDPError):
    """Counts were required but a negative value was given."""


class FractionalCountError(SparseDPError):
    """Counts were required but a value is not an integer (``1.5``): a count is a whole number of
    records, and a fraction is usually a sign of a wrong column or of pre-processed data."""


class InfeasibleConstraintsError(SparseDPError):
    """A system of linear constraints has no solution."""


class UnsupportedStructureError(SparseDPError):
    """A fast path was requested for an operator that does not have the needed structure."""


class InputBoundError(SparseDPError):
    """Input lies outside the documented domain of a release (e.g. a count above
    :data:`sparsedp.validation.MAX_MAGNITUDE`, a stream increment outside its counter's domain).  Raised before any
    budget is charged or noise drawn: outside the domain no privacy guarantee is claimed."""


class UnsafeFileError(SparseDPError):
    """A file sparsedp was asked to read is refused before it is opened: a release file names a
    file outside its own directory (an absolute path, ``..`` or a symlink leading out), or a Zarr
    array's metadata asks for something other than plain numbers under well-known numeric codecs
    (:mod:`sparsedp.safe_files`)."""


class ReleaseExistsError(SparseDPError, FileExistsError):
    """A release would be saved over an existing file: ``save`` replaces one only with
    ``overwrite=True`` (the command line's ``--force``).  Also a :class:`FileExistsError`."""
