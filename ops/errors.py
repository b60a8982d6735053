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


class UnknownInput(InvalidArgument):
    """A call names an input the operator does not have."""


class MissingInput(InvalidArgument):
    """A call lacks an input the operator needs.

    Attributes
    ----------
    input : str
        The missing input's name.
    kind : {"array", "parameter"}
        Whether it is an array input or a keyword parameter, so that a door can say how to
        give it (``--input``, ``--param``, an ``href``...).
    """

    def __init__(self, message: str, input: str, kind: str):
        super().__init__(message)
        self.input = input
        self.kind = kind
