"""Errors of input: expected paths that end in one clear message and exit status 2."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union


class InputError(Exception):
    """A file or argument that zeropilot cannot read.

    The message names the file and, where known, the line and column, so the CLI prints it
    as one line and exits with status 2 instead of a traceback.
    """

    def __init__(
        self,
        message: str,
        path: Optional[Union[str, Path]] = None,
        line: Optional[int] = None,
        col: Optional[int] = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.col = col
        self.reason = message
        super().__init__(self.render())

    def render(self) -> str:
        where = ""
        if self.path:
            where = self.path
            if self.line is not None:
                where += f":{self.line}"
                if self.col is not None:
                    where += f":{self.col}"
            where += ": "
        return f"{where}{self.reason}"
