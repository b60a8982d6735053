"""Errors raised by the operators."""


class InvalidArgument(ValueError):
    """An argument breaks one of an operator's rules (docs/operators.md lists them).

    The message names the parameter, the rule and the offending value, e.g.
    ``block_size must be >= 2, got 1``. Raised before any work is scheduled.
    """


class DimensionError(InvalidArgument):
    """The dims an operator needs are missing, ambiguous or named wrongly."""


class NotApplicable(InvalidArgument):
    """The operator does not apply to this array (a Dataset leaves such variables untouched)."""


class MissingDims(DimensionError, NotApplicable):
    """The array lacks a dim the operator needs."""
