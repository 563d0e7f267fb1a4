"""The exception every bad input raises, from the C++ core and from the CLI alike."""


class InputError(ValueError):
    """Invalid input. ``path`` is the JSON pointer of the offending field ("/parallel/tp"; ""
    for the document itself), ``code`` the CLI's error code ("invalid_input"), and ``message``
    the reason, exactly as ``distplan`` prints them on stderr."""

    def __init__(self, message: str, path: str = "", code: str = "invalid_input") -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.code = code

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message
