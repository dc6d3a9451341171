"""Reading a launch: DeepSpeed JSON, training arguments (YAML/JSON/flags), accelerate YAML, shell scripts,
Python scripts and versions, into one typed :class:`Launch` whose every value knows its file, key path
and line. Imports no torch, deepspeed or transformers.

Use::

    from zeropilot.launch import load_launch
    launch = load_launch(["examples/seed"], versions="deepspeed=0.14.2+das.opt1")
    for train, ds in launch.training_pairs():
        ...
"""

from zeropilot.launch.document import Document, Node
from zeropilot.launch.load import load_launch, read_text
from zeropilot.launch.model import Launch, PythonFile, Reference, WorldSize
from zeropilot.launch.versions import Versions

__all__ = ["Document", "Launch", "Node", "PythonFile", "Reference", "Versions", "WorldSize", "load_launch",
           "read_text"]
