"""GitHub Actions workflow commands: one ``::error``/``::warning``/``::notice`` line per finding.

GitHub shows each as an annotation on the file and line of the pull request
(https://docs.github.com/actions/reference/workflow-commands-for-github-actions): ``::error file=F,line=L,
col=C,title=T::MESSAGE``. Values are escaped as the runner unescapes them (``%``, CR and LF in the message;
also ``:`` and ``,`` in properties), so a message cannot end the command early or start another one.
"""

from __future__ import annotations

from typing import List

from zeropilot.findings import CheckResult
from zeropilot.findings.sarif import relative_uri

_COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _command(kind: str, message: str, file=None, line=None, col=None, title=None) -> str:
    props = []
    if file:
        props.append(f"file={_prop(relative_uri(file))}")
        if line:
            props.append(f"line={int(line)}")
            if col:
                props.append(f"col={int(col)}")
    if title:
        props.append(f"title={_prop(title)}")
    return f"::{kind} {','.join(props)}::{_data(message)}" if props else f"::{kind}::{_data(message)}"


def render(result: CheckResult) -> str:
    """Every finding and every unreadable file as a workflow command, then the summary as plain text."""
    lines: List[str] = []
    for f in sorted(result.findings, key=lambda f: (f.file or "", f.line or 0, f.code)):
        title = f"{f.code} {f.name}" + (f" ({f.key})" if f.key else "")
        message = f.message + (f" Fix ({f.fix.applicability.value}): {f.fix.description}" if f.fix else "")
        lines.append(_command(_COMMANDS[f.severity.value], message, f.file, f.line, f.col, title))
    for err in result.read_errors:
        lines.append(_command("error", err.reason, err.path, err.line, err.col, "zeropilot: cannot read"))
    for notice in result.notices:
        lines.append(_command("warning", notice, title="zeropilot"))
    s = result.summary()
    lines.append(f"zeropilot check: {s['errors']} error(s), {s['warnings']} warning(s), {s['info']} info in "
                 f"{s['files']} file(s); {s['unreadable']} could not be read")
    return "\n".join(lines) + "\n"
