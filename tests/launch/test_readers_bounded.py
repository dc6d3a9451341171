"""Readers on hostile and large input: linear, bounded, one clear error (issue 13).

Timing lives in bench/check/readers.py; here each input must end in a result or one InputError, never a
traceback, and the limits are those documented in the readers.
"""

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from tests.conftest import write_files
from zeropilot.errors import InputError
from zeropilot.launch import load_launch
from zeropilot.launch.document import MAX_NODES, LineIndex, line_col, node_budget
from zeropilot.launch.jsonread import read_json
from zeropilot.launch.pyread import parse_python
from zeropilot.launch.shell import MAX_LINE, parse_script
from zeropilot.launch.yamlread import parse_yaml

SEVEN_MB = 7 * 1024 * 1024


def billion_laughs() -> str:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for prev, name in zip("abcdefgh", "bcdefghi"):
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    return text


def test_line_index_agrees_with_counting():
    text = "a\n\nbc\nd"
    index = LineIndex(text)
    assert [index.line_col(i) for i in range(len(text) + 1)] == [line_col(text, i) for i in range(len(text) + 1)]


def test_billion_laughs_is_refused_within_its_budget():
    text = billion_laughs()
    assert len(text) < 450
    with pytest.raises(InputError, match="aliases are expanded") as info:
        parse_yaml(text, Path("lol.yaml"))
    assert str(node_budget(text)) in info.value.reason


def test_aliases_within_budget_expand_like_safe_load():
    text = "base: &b {stage: 3, offload: {device: cpu}}\nz1: *b\nz2: *b\n"
    root = parse_yaml(text, Path("a.yaml"))
    assert root.plain() == yaml.safe_load(text)
    assert root.child("z2").child("stage").path == "z2.stage"


@pytest.mark.parametrize("reader, text", [
    (read_json, "[" + "1," * (SEVEN_MB // 2) + "1]"),
    (parse_yaml, "[" + "1," * (SEVEN_MB // 2) + "1]"),
], ids=["json", "yaml"])
def test_seven_mb_single_line_of_values_is_refused(reader, text):
    with pytest.raises(InputError, match=f"more than {MAX_NODES} values"):
        reader(text, Path("big"))


def test_seven_mb_single_line_string_reads():
    text = '{"a": "' + "x" * SEVEN_MB + '"}'
    assert len(read_json(text, Path("a.json")).root.child("a").value) == SEVEN_MB
    assert len(parse_yaml("a: " + "x" * SEVEN_MB, Path("a.yaml")).child("a").value) == SEVEN_MB


@pytest.mark.parametrize("text", ["deepspeed train.py " + "--a 1 " * (SEVEN_MB // 6),
                                  "echo '" + "x" * SEVEN_MB, "deepspeed x.py \\\n" * (SEVEN_MB // 17)],
                         ids=["one-line", "open-quote", "continuations"])
def test_seven_mb_shell_line_is_not_a_command(text):
    script = parse_script(text, Path("run.sh"))
    assert script.commands == [] and script.long_lines[0][1] > SEVEN_MB * 0.9


def test_a_skipped_long_line_is_a_notice(tmp_path):
    write_files(tmp_path, {"run.sh": "export A=1\ndeepspeed t.py " + "--a 1 " * 50_000 + "\n"})
    from zeropilot.check import check

    result, _ = check([tmp_path], use_installed=False)
    assert result.notices == [f"{tmp_path / 'run.sh'}:2: a line of 300015 characters was not read as a command "
                              "(longer than 256 KiB: no launch command is)"]


def test_shell_script_of_too_many_words_is_one_input_error():
    text = ("echo " + "w " * 40_000 + "\n") * 6
    with pytest.raises(InputError, match="more than 200000 words: not a launch script"):
        parse_script(text, Path("run.sh"))


def test_long_shell_line_below_the_limit_is_read():
    line = "deepspeed train.py --deepspeed ds.json " + "--x 1 " * ((MAX_LINE - 100) // 6)
    (command,) = parse_script(line + "\n", Path("run.sh")).commands
    assert command.argv[:4] == ["deepspeed", "train.py", "--deepspeed", "ds.json"]


def test_variable_doubling_stays_bounded():
    text = "A=xx\n" + "A=$A$A$A$A\n" * 40 + "deepspeed train.py --deepspeed $A\n"
    (command,) = parse_script(text, Path("run.sh")).commands
    assert len(command.argv[-1]) <= MAX_LINE


@pytest.mark.parametrize("reader, text, name", [
    (read_json, '{"a": ' + "9" * 5000 + "}", "json.load"),
    (parse_yaml, "a: " + "9" * 5000, "yaml.safe_load"),
], ids=["json", "yaml"])
def test_5000_digit_number_is_an_input_error(reader, text, name):
    with pytest.raises(InputError, match=f"a number of 5000 characters \\({name}"):
        reader(text, Path("n"))


@pytest.mark.parametrize("source", [
    "x = " + "1+" * 200_000 + "1",        # RecursionError in ast construction
    "x = " + "-" * 200_000 + "1",         # MemoryError in the parser
    "x = " + "not " * 100_000 + "1",
    "x = a" + ".b" * 200_000,
    "x = " + "1 if 1 else " * 30_000 + "1",
    "x = " + "+" * 2_000 + "1",
    "x = " + "1+" * 400 + "1",            # parses, but deeper than the rules' visitors should walk
], ids=["binop", "unary-minus", "not", "attribute", "if-else", "unary-plus", "parses-but-deep"])
def test_deep_python_is_one_input_error(source):
    with pytest.raises(InputError, match="nested"):
        parse_python(source, Path("train.py"))


def test_python_syntax_error_is_not_an_input_error():
    tree, why = parse_python("def f(:\n", Path("train.py"))
    assert tree is None and "invalid syntax" in why


def test_deep_python_in_a_launch_is_a_read_error(tmp_path):
    write_files(tmp_path, {"train.py": "x = " + "-" * 100_000 + "1\n"})
    launch = load_launch([tmp_path], use_installed=False)
    assert [e.reason for e in launch.read_errors] == ["Python expression nested too deeply to read"]


# --- hjson: what DeepSpeed's loader accepts beyond JSON ------------------------------------------------------

HJSON_TEXT = """{
  // ZeRO settings
  "zero_optimization": {
    "stage": 3,  # the stage
    /* block */ "overlap_comm": true,
  },
  "train_micro_batch_size_per_gpu": 1,
}
"""


def test_comments_and_trailing_commas_read_like_hjson_with_positions():
    hjson = pytest.importorskip("hjson")
    read = read_json(HJSON_TEXT, Path("ds.json"))
    assert read.root.plain() == json.loads(json.dumps(hjson.loads(HJSON_TEXT)))
    stage = read.root.child("zero_optimization").child("stage")
    assert (stage.line, stage.key_line, stage.path) == (4, 4, "zero_optimization.stage")
    assert read.relaxed == [(2, "comment"), (4, "comment"), (5, "trailing comma"), (7, "trailing comma")]


def test_relaxed_ds_config_is_read_by_deepspeed_but_refused_for_the_hf_trainer(tmp_path):
    write_files(tmp_path / "raw", {"ds.json": HJSON_TEXT,
                                   "run.sh": "deepspeed train.py --deepspeed_config ds.json\n"})
    assert load_launch([tmp_path / "raw"], use_installed=False).read_errors == []
    write_files(tmp_path / "hf", {"ds.json": HJSON_TEXT,
                                  "train.yaml": "model_name_or_path: x\noutput_dir: o\ndeepspeed: ds.json\n"})
    (err,) = load_launch([tmp_path / "hf"], use_installed=False).read_errors
    assert err.line == 2 and "json.load" in err.reason and "hjson" in err.reason


# --- discovery: files beside a launch that are not launches ------------------------------------------------

def qwen2_like_tokenizer(vocab: int = 150_000) -> dict:
    tokens = {f"\u0120tok{i}": i for i in range(vocab)}
    return {"version": "1.0", "added_tokens": [], "model": {"type": "BPE", "vocab": tokens,
                                                            "merges": [f"\u0120t ok{i}" for i in range(vocab)]}}


def test_tokenizer_model_config_dataset_and_big_files_are_skipped(tmp_path):
    write_files(tmp_path, {
        "ds.json": {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1},
        "tokenizer.json": qwen2_like_tokenizer(), "tokenizer_config.json": {"model_max_length": 32768},
        "vocab.json": {"a": 0}, "generation_config.json": {"do_sample": True},
        "model.safetensors.index.json": {"weight_map": {}},
        "model/config.json": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 8},
        "data/train.json": [{"instruction": "hi", "output": "ho"}],
        "data/chat.json": '{"messages": []}\n{"messages": []}\n',  # JSON Lines under a .json name
    })
    (tmp_path / "blob.yaml").write_bytes(b"a: 1\n" * (2 * 1024 * 1024))  # 10 MiB: over the 8 MiB cap
    launch = load_launch([tmp_path], use_installed=False)
    assert launch.read_errors == []
    assert [d.path.name for d in launch.documents] == ["ds.json"]
    skipped = {p.name: why for p, why in launch.skipped}
    assert set(skipped) == {"tokenizer.json", "tokenizer_config.json", "vocab.json", "generation_config.json",
                            "model.safetensors.index.json", "config.json", "train.json", "chat.json", "blob.yaml"}
    assert skipped["config.json"] == "a model config" and "8 MiB" in skipped["blob.yaml"]


def test_a_named_big_file_is_still_an_input_error(tmp_path):
    path = tmp_path / "blob.yaml"
    path.write_bytes(b"a: 1\n" * (2 * 1024 * 1024))
    (err,) = load_launch([path], use_installed=False).read_errors
    assert "larger than 8 MiB" in err.reason


# --- fuzz: the new limits never turn into a traceback -------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 12), depth=st.integers(1, 8))
def test_fuzz_alias_fanout_is_expanded_or_refused(width, depth):
    text = "l0: &l0 [x]\n" + "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]\n"
                                     for i in range(1, depth + 1))
    sizes = [2]  # values in l0 once expanded: the list and "x"
    for _ in range(depth):
        sizes.append(1 + width * sizes[-1])
    total = 1 + sum(1 + n for n in sizes)  # the top mapping, and a key and its value per line
    try:
        root = parse_yaml(text, Path("f.yaml"))
    except InputError as exc:
        assert "aliases are expanded" in exc.reason and total > node_budget(text)
    else:
        assert total <= node_budget(text) and root.plain() == yaml.safe_load(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
decorations = st.sampled_from(["", " ", "\n", " // c\n", " # c\n", " /* c */ ", "/**/"])


@settings(max_examples=150, deadline=None)
@given(json_values, st.data())
def test_fuzz_comments_and_trailing_commas_keep_values(value, data):
    """Comments between any two tokens and a trailing comma in any container change no value."""
    tokens = json.dumps(value, separators=(",", ":"))
    out, in_string, escaped, last = [], False, False, ""
    for ch in tokens:
        if not in_string and ch in "]}" and last not in "[{" and data.draw(st.booleans()):
            out.append(",")
        out.append(ch)
        last = ch
        if in_string:
            escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in ",:[{":
            out.append(data.draw(decorations))
    text = "".join(out)
    assert read_json(text, Path("f.json")).root.plain() == value


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab =$#;&|()'\"\\\t-", max_size=40))
def test_fuzz_shell_tokens_match_shlex(line):
    """The regex tokenizer splits a line as shlex (posix, punctuation ;&|(), # comments) does."""
    import shlex

    from zeropilot.launch.shell import _split

    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        expected = list(lexer)
    except ValueError:  # unbalanced quotes: both fall back to a plain split
        return
    assert [w for w, _ in (_split(line) or [])] == expected


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="()[]{}+-*/ .,:=ab1'\"\nif else lambda not", max_size=400))
def test_fuzz_python_reader_never_crashes(source):
    try:
        parse_python(source, Path("f.py"))
    except InputError as exc:
        assert "nested" in exc.reason


def test_many_flags_on_one_command_keep_their_line(tmp_path):
    flags = " ".join(f"--k{i} {i}" for i in range(15_000))  # 200 KB: under the 256 KiB line limit
    write_files(tmp_path, {"run.sh": "\n" * 1000 + "deepspeed train.py --deepspeed ds.json " + flags + "\n"})
    (doc,) = load_launch([tmp_path], use_installed=False).documents
    assert doc.fmt == "flags" and doc.root.child("k14999").line == 1001 and doc.root.child("k14999").value == 14999
