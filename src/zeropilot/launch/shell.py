"""Reading shell launch scripts: exported variables and the commands they run, with line numbers.

Parsed, never run. Handles line continuations, comments, ``export A=1 B=2``, ``VAR=x cmd`` prefixes,
and commands joined by ``;``, ``&&``, ``||``, ``|`` and ``&``. ``$VAR`` and ``${VAR}`` are expanded from
variables the script set before, so config paths resolve.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from zeropilot.errors import InputError

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
_SEPARATORS = {";", "&&", "||", "|", "&", ";;", "(", ")"}
_KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "time", "exec", "nohup", "!", "{", "}"}


@dataclass
class EnvSetting:
    """A variable a script sets: ``export NAME=value`` (exported) or ``NAME=value`` (shell only)."""

    name: str
    value: str
    file: Path
    line: int
    exported: bool
    command: Optional[str] = None  # set for ``NAME=value cmd`` prefixes: the command it applies to


@dataclass
class Command:
    """One simple command: its words after variable expansion, the file and line where it starts."""

    argv: List[str]
    file: Path
    line: int
    env: Dict[str, EnvSetting] = field(default_factory=dict)
    text: str = ""
    offsets: List[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return Path(self.argv[0]).name if self.argv else ""


@dataclass
class Script:
    path: Path
    text: str
    env: List[EnvSetting] = field(default_factory=list)
    commands: List[Command] = field(default_factory=list)
    long_lines: List[Tuple[int, int]] = field(default_factory=list)  # (line, characters) not read as commands

    def exported(self) -> Dict[str, EnvSetting]:
        """The last setting of each variable that is exported (or set as a command prefix)."""
        out: Dict[str, EnvSetting] = {}
        names_exported = {e.name for e in self.env if e.exported}
        for setting in self.env:
            if setting.exported or setting.name in names_exported:
                out[setting.name] = setting
        return out


MAX_LINE = 256 * 1024
MAX_WORDS = 200_000
_PHYSICAL = re.compile(r"[^\n]*\n?")
# One token as shlex (posix, whitespace_split, punctuation_chars=";&|()", commenters="#") splits it: blanks,
# a comment, a run of punctuation, or a word of unquoted, quoted and backslash-escaped parts. Each part is
# unambiguous (a double-quoted string is the unrolled "[^"\\]*(?:\\.[^"\\]*)*"), so a failed match never
# backtracks more than once over the text: linear.
_TOKEN = re.compile(r"""(?P<blank>[ \t\r\n]+)|(?P<comment>\#.*)|(?P<punct>[;&|()]+)|"""
                    r"""(?P<word>(?:'[^']*'|"[^"\\]*(?:\\[\s\S][^"\\]*)*"|\\[\s\S]|[^\s'"\\;&|()\#]+)+)""", re.S)
_PART = re.compile(r"""'([^']*)'|"([^"\\]*(?:\\[\s\S][^"\\]*)*)"|\\([\s\S])|([^'"\\]+)""")
_IN_DOUBLE = re.compile(r"""\\([\\"])""")


@dataclass
class Origin:
    """Where the characters of a joined logical line came from: (offset in line, offset in file) per piece."""

    pieces: List[Tuple[int, int]] = field(default_factory=list)
    length: int = 0

    def add(self, file_offset: int, length: int) -> None:
        self.pieces.append((self.length, file_offset))
        self.length += length

    def __call__(self, index: int) -> int:
        """The file offset of character ``index`` of the logical line."""
        if not self.pieces:
            return 0
        i = max(bisect_right(self.pieces, (index, float("inf"))) - 1, 0)
        line_at, file_at = self.pieces[i]
        return file_at + index - line_at


def _logical_lines(text: str) -> Iterator[Tuple[int, str, Origin]]:
    """(first line number, joined text, origin) with ``\\`` continuations joined.

    A logical line longer than :data:`MAX_LINE` (far above the kernel's 128 KiB limit on one argument) is no
    launch command: it is yielded empty, and its pieces are not kept, so memory stays bounded.
    """
    buf: List[str] = []
    origin = Origin()
    start_line = None
    offset = 0
    lineno = 0
    for m in _PHYSICAL.finditer(text):
        line = m.group(0)
        if not line:
            break
        lineno += 1
        stripped = line.rstrip("\r\n")
        if start_line is None:
            start_line = lineno
        cont = stripped.endswith("\\") and not stripped.endswith("\\\\")
        body = stripped[:-1] + " " if cont else stripped
        if origin.length <= MAX_LINE:
            buf.append(body)
            origin.add(offset, len(body))
        else:
            buf = []
            origin.length += len(body)  # counted, not kept
        offset += len(line)
        if cont:
            continue
        yield start_line, ("".join(buf) if origin.length <= MAX_LINE else ""), origin
        buf, origin, start_line = [], Origin(), None
    if start_line is not None:  # the file ended inside a continuation
        yield start_line, ("".join(buf) if origin.length <= MAX_LINE else ""), origin


class _TooLong(Exception):
    pass


def _expand(word: str, variables: Dict[str, str]) -> str:
    """``$VAR``/``${VAR}``/``${VAR:-default}`` replaced from ``variables``; the word itself when the result
    would pass :data:`MAX_LINE` (``A=$A$A`` on each of 40 lines is 2**40 characters, no launch value)."""
    if "$" not in word:
        return word
    size = [len(word)]

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        value = variables[name] if name in variables else (default if default is not None else m.group(0))
        size[0] += len(value)
        if size[0] > MAX_LINE:
            raise _TooLong
        return value

    try:
        return _VAR.sub(sub, word)
    except _TooLong:
        return word


def _part(m: re.Match) -> str:
    """One quoted, escaped or plain part of a word, as the shell reads it."""
    if m.lastindex == 2:  # "..." keeps backslashes except before \\ and "
        return _IN_DOUBLE.sub(r"\1", m.group(2)) if "\\" in m.group(2) else m.group(2)
    return m.group(m.lastindex)


def _unquote(word: str) -> str:
    """A word's value as shlex (posix) gives it: quotes removed, backslash escapes applied."""
    if "'" not in word and '"' not in word and "\\" not in word:
        return word
    return _PART.sub(_part, word)


def _split(line: str) -> Optional[List[Tuple[str, int]]]:
    """(word, offset in line) of each token; separators are words too. Linear: one regular expression.

    Behaves like ``shlex`` (posix, punctuation ``;&|()``, ``#`` comments) would, which read one character per
    Python step (7 s for a 7 MB line). Unbalanced quotes: a plain split of the text before any ``#``.
    """
    words: List[Tuple[str, int]] = []
    pos, n = 0, len(line)
    while pos < n:
        m = _TOKEN.match(line, pos)
        if m is None:  # an unbalanced quote or a trailing backslash
            head = line.split("#", 1)[0]
            return [(w.group(0), w.start()) for w in re.finditer(r"\S+", head)] or None
        kind = m.lastgroup
        if kind == "comment":
            break
        if kind == "punct":
            words.append((m.group(0), m.start()))
        elif kind == "word":
            words.append((_unquote(m.group(0)), m.start()))
        pos = m.end()
    return words


def parse_script(text: str, path: Path) -> Script:
    """Parse a shell script's text into variable settings and commands.

    Raises:
        InputError: more than :data:`MAX_WORDS` words (launch scripts have a few thousand at most): reading on
            would cost seconds and hundreds of MB for something that is not a launch script.
    """
    script = Script(path=path, text=text)
    variables: Dict[str, str] = {}
    count = 0
    for lineno, line, origin in _logical_lines(text):
        if origin.length > MAX_LINE:
            script.long_lines.append((lineno, origin.length))
            continue
        words = _split(line)
        if not words:
            continue
        count += len(words)
        if count > MAX_WORDS:
            raise InputError(f"more than {MAX_WORDS} words: not a launch script", path, lineno)
        current: List[Tuple[str, int]] = []
        for word in words + [(";", len(line))]:
            if word[0] in _SEPARATORS:
                if current:
                    _add_command(script, current, path, lineno, line, origin, variables)
                current = []
            else:
                current.append(word)
    return script


def _add_command(script, tokens, path, lineno, line, origin, variables) -> None:
    while tokens and tokens[0][0] in _KEYWORDS:
        tokens = tokens[1:]
    prefix: Dict[str, EnvSetting] = {}
    while tokens and _ASSIGN.match(tokens[0][0]):
        name, value = _ASSIGN.match(tokens[0][0]).groups()
        prefix[name] = EnvSetting(name, _expand(value, variables), path, lineno, exported=False)
        tokens = tokens[1:]
    words = [w for w, _ in tokens]
    if not words:
        for setting in prefix.values():
            variables[setting.name] = setting.value
            script.env.append(setting)
        return
    if words[0] in ("export", "declare", "typeset") and prefix == {}:
        for word in words[1:]:
            m = _ASSIGN.match(word)
            if m:
                value = _expand(m.group(2), variables)
                variables[m.group(1)] = value
                script.env.append(EnvSetting(m.group(1), value, path, lineno, exported=True))
            elif not word.startswith("-"):
                value = variables.get(word)
                if value is not None:
                    script.env.append(EnvSetting(word, value, path, lineno, exported=True))
        return
    argv = [_expand(w, variables) for w in words]
    for setting in prefix.values():
        setting.command = argv[0]
        setting.exported = True
        script.env.append(setting)
    offsets = [origin(at) for _, at in tokens]
    script.commands.append(Command(argv, path, lineno, prefix, line.strip(), offsets))
