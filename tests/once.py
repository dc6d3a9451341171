"""Work done once per test run, whichever process of it asks first: the suite runs in two pytest-xdist workers
(``ci/test.sh``), and a DeepSpeed job or a checkpoint build that tests in several files use would otherwise run in
each worker that collects one of them.

:func:`shared_dir` is one folder for the whole run: made by the first process that imports ``tests/conftest.py``
(the controller under xdist, or pytest itself), handed to the workers in ``ZEROPILOT_TESTS_SHARED``, removed when
that first process exits. :func:`once` caches a function's result there under a file lock: the first caller runs it
and pickles its result, a caller in another worker waits for the lock and reads it. Within one process it is an
``lru_cache`` as before. A call that raises leaves nothing: the next caller runs it again.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import os
import pickle
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

ENV = "ZEROPILOT_TESTS_SHARED"
T = TypeVar("T")


def make_shared_dir() -> None:
    """Called by ``tests/conftest.py`` in every process: the first one makes the folder and owns its removal."""
    if os.environ.get(ENV) and Path(os.environ[ENV]).is_dir():
        return
    path = tempfile.mkdtemp(prefix="zeropilot-tests-shared-")
    atexit.register(shutil.rmtree, path, True)
    os.environ[ENV] = path


def shared_dir(name: str) -> Path:
    """``name`` under the run's shared folder, made if missing."""
    make_shared_dir()
    path = Path(os.environ[ENV]) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def locked(name: str) -> Iterator[Path]:
    """Hold the run-wide lock ``name`` (blocking); yields the lock's folder for the work it guards."""
    folder = shared_dir("locks")
    with open(folder / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def once(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``'s result for the same arguments computed once in the whole test run (see the module)."""

    @functools.lru_cache(maxsize=None)
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        key = f"{fn.__module__}.{fn.__qualname__}{args!r}{sorted(kwargs.items())!r}"
        name = f"{fn.__name__}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
        with locked(name) as folder:
            done = folder / f"{name}.pickle"
            if done.is_file():
                return pickle.loads(done.read_bytes())
            value = fn(*args, **kwargs)
            tmp = folder / f".{name}.tmp"
            tmp.write_bytes(pickle.dumps(value))
            os.replace(tmp, done)
            return value

    return wrapper
