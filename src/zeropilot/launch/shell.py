"""Reading shell launch scripts: exported variables and the commands they run, with line numbers.

Parsed, never run. Handles line continuations, comments, ``export A=1 B=2``, ``VAR=x cmd`` prefixes,
and commands joined by ``;``, ``&&``, ``||``, ``|`` and ``&``. ``$VAR`` and ``${VAR}`` are expanded from
variables the script set before, so config paths resolve.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

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

    def exported(self) -> Dict[str, EnvSetting]:
        """The last setting of each variable that is exported (or set as a command prefix)."""
        out: Dict[str, EnvSetting] = {}
        names_exported = {e.name for e in self.env if e.exported}
        for setting in self.env:
            if setting.exported or setting.name in names_exported:
                out[setting.name] = setting
        return out


def _logical_lines(text: str):
    """(first line number, joined text, origin) with ``\\`` continuations joined.

    ``origin[i]`` is the offset in ``text`` of character ``i`` of the joined line.
    """
    buf: List[str] = []
    origin: List[int] = []
    start_line = None
    offset = 0
    for lineno, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.rstrip("\r\n")
        if start_line is None:
            start_line = lineno
        cont = stripped.endswith("\\") and not stripped.endswith("\\\\")
        body = stripped[:-1] + " " if cont else stripped
        buf.append(body)
        origin.extend(range(offset, offset + len(body)))
        offset += len(line)
        if cont:
            continue
        yield start_line, "".join(buf), origin
        buf, origin, start_line = [], [], None
    if buf:
        yield start_line, "".join(buf), origin


def _expand(word: str, variables: Dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name in variables:
            return variables[name]
        return default if default is not None else m.group(0)

    return _VAR.sub(sub, word)


def _split(line: str) -> Optional[List[str]]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: fall back to a plain split
        return line.split("#", 1)[0].split() or None


def parse_script(text: str, path: Path) -> Script:
    """Parse a shell script's text into variable settings and commands."""
    script = Script(path=path, text=text)
    variables: Dict[str, str] = {}
    for lineno, line, origin in _logical_lines(text):
        words = _split(line)
        if not words:
            continue
        current: List[str] = []
        cursor = [0]
        for word in words + [";"]:
            if word in _SEPARATORS:
                if current:
                    _add_command(script, current, path, lineno, line, origin, variables, cursor)
                current = []
            else:
                current.append(word)
    return script


def _add_command(script, words, path, lineno, line, origin, variables, cursor) -> None:
    while words and words[0] in _KEYWORDS:
        words = words[1:]
    prefix: Dict[str, EnvSetting] = {}
    while words and _ASSIGN.match(words[0]):
        name, value = _ASSIGN.match(words[0]).groups()
        prefix[name] = EnvSetting(name, _expand(value, variables), path, lineno, exported=False)
        words = words[1:]
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
    offsets = []
    pos = cursor[0]
    for w in words:
        idx = line.find(w[:20], pos) if w else -1
        if idx < 0:
            idx = pos
        offsets.append(origin[idx] if idx < len(origin) else (origin[-1] if origin else 0))
        pos = idx + 1
    cursor[0] = pos
    script.commands.append(Command(argv, path, lineno, prefix, line.strip(), offsets))
