"""Rules about shell launch scripts: commands that harm other jobs, process counts the visible devices
cannot serve, and config files that are not there."""

from __future__ import annotations

from typing import Iterator, Optional

from zeropilot.launch import Launch
from zeropilot.launch.shell import Command
from zeropilot.rules.registry import Hit, Severity, rule

_KILLERS = ("pkill", "killall")
# Commands that find processes by name; a kill fed by them on the same line kills by name too.
_FINDERS = ("pgrep", "pidof", "grep")


def _kill_target(cmd: Command) -> Optional[str]:
    """What a destructive kill command hits, or None when it names its own processes."""
    args = cmd.argv[1:]
    if cmd.name in _KILLERS:
        patterns = [a for a in args if not a.startswith("-")]
        broad = "-f" in args or any("f" in a[1:] for a in args if a.startswith("-") and not a.startswith("--")
                                    and a[1:].isalpha())
        what = " ".join(patterns) or "processes"
        return f"every process matching {what!r}{' anywhere in its command line' if broad else ''}"
    if cmd.name == "kill" and len(args) >= 2 and args[-1] == "-1":
        return "every process you own (pid -1)"
    kills = cmd.name == "kill" or (cmd.name == "xargs" and "kill" in args)
    finder = next((w for w in cmd.text.replace("|", " ").replace("(", " ").split() if w in _FINDERS), None)
    if kills and finder is not None:
        return f"every process that {finder} finds by name"
    return None


@rule("SH001", "destructive-kill-in-launch-script", Severity.WARNING, versions="all",
      witness="tests/rules/test_launch_script.py::test_sh001_witness")
def destructive_kill_in_launch_script(launch: Launch) -> Iterator[Hit]:
    """`pkill`/`killall` by name, or `kill -1`, in a launch script.

    ## Why is this bad?
    `pkill -9 python` (or `ps aux | grep python | awk '{print $2}' | xargs kill -9`, or
    `kill -9 $(pgrep -f train.py)`) kills every Python process of the user on the node, not the ones this
    launch started: another training job, a notebook kernel, an evaluation, a data-preparation run, and on a
    shared account other people's work. `pkill -f` matches whole command lines and hits even more.
    `-9` also denies the victims any cleanup (half-written checkpoints, leaked shared memory).

    ## Example
    ```bash
    pkill -9 python
    pkill -9 torchrun
    FORCE_TORCHRUN=1 llamafactory-cli train sft.yaml
    ```

    ## Use instead
    ```bash
    # stop only what this script started earlier: remember its process group
    [ -f train.pid ] && kill -TERM -- -"$(cat train.pid)"
    setsid llamafactory-cli train sft.yaml & echo $! > train.pid; wait
    ```

    ## References
    - `pkill(1)`, `kill(1)` (pid -1: every process the user may signal)
    """
    for script in launch.scripts:
        for cmd in script.commands:
            target = _kill_target(cmd)
            if target is None:
                continue
            yield Hit(None, None, f"`{' '.join(cmd.argv)}` kills {target} on the node — other jobs and "
                                  "sessions too, without cleanup; stop only the process group this script "
                                  "started (save its pid).", file=cmd.file, line=cmd.line, key=cmd.name)


@rule("SH002", "world-size-exceeds-visible-devices", Severity.ERROR, versions="all",
      witness="tests/rules/test_launch_script.py::test_sh002_deepspeed_witness")
def world_size_exceeds_visible_devices(launch: Launch) -> Iterator[Hit]:
    """More processes per node than the `*_VISIBLE_DEVICES` list gives devices, or `deepspeed --num_gpus` with
    `CUDA_VISIBLE_DEVICES`.

    DeepSpeed's launcher honours `CUDA_VISIBLE_DEVICES` only without `--num_gpus`/`--include`/`--exclude`/
    `--num_nodes` (it turns the list into `--include localhost:<list>`). With `--num_gpus N` it prints "ignoring
    it", **deletes** the variable and starts N ranks on physical devices `0..N-1`: more ranks than listed
    devices do not fail, they run on GPUs you did not list (other jobs' GPUs), and a list such as `2,3` is
    silently replaced by `0,1`. That case is reported whenever the listed devices are not exactly `0..N-1`.

    ## Why is this bad?
    Each torchrun / LLaMA-Factory process binds to device `LOCAL_RANK`; with `NPROC_PER_NODE=8` and
    `CUDA_VISIBLE_DEVICES=0,1,2,3` ranks 4-7 fail with `CUDA error: invalid device ordinal` (seen with
    torchrun, 2 processes and one visible GPU: rank 0 ran, rank 1 failed) and the launch dies. Under
    `deepspeed --num_gpus` the run instead lands on the wrong GPUs.

    ## Example
    ```bash
    export ROCR_VISIBLE_DEVICES=0,1,2,3
    NPROC_PER_NODE=8 FORCE_TORCHRUN=1 llamafactory-cli train sft.yaml
    CUDA_VISIBLE_DEVICES=2,3 deepspeed --num_gpus 2 train.py   # runs on GPUs 0 and 1
    ```

    ## Use instead
    ```bash
    export ROCR_VISIBLE_DEVICES=0,1,2,3
    NPROC_PER_NODE=4 FORCE_TORCHRUN=1 llamafactory-cli train sft.yaml
    deepspeed --include localhost:2,3 train.py                 # or CUDA_VISIBLE_DEVICES=2,3 deepspeed train.py
    ```

    ## References
    - `torch.cuda.set_device`; torchrun `--nproc_per_node`; LLaMA-Factory `launcher.py` (NPROC_PER_NODE)
    - measured on an H200: 'CUDA error: invalid device ordinal' (`tests/witness/cuda_probe_h200.json`,
      `nproc_2_on_1_visible`)
    - `deepspeed/launcher/runner.py` `main` ("ignoring it because ... --num_gpus ... were used",
      `del os.environ[visible_devices_env]`, `apply_num_nodes_and_gpus`: `list(range(num_gpus))`)
    """
    ws = launch.world_size
    if ws.nproc_per_node is None or ws.visible_devices is None or ws.visible_var is None:
        return
    var = ws.visible_var
    ds_cmd = _deepspeed_num_gpus_command(launch, ws)
    if ds_cmd is not None and var.name == "CUDA_VISIBLE_DEVICES":
        yield from _deepspeed_ignores_visible(ds_cmd, ws)
        return
    if ws.nproc_per_node <= ws.visible_devices:
        return
    yield Hit(None, None, f"{ws.nproc_per_node} processes per node ({ws.reason}) but {var.name}={var.value} "
                          f"makes {ws.visible_devices} device(s) visible: the extra ranks fail on set_device; "
                          f"start {ws.visible_devices} processes or list more devices.",
              file=ws.file or var.file, line=ws.line or var.line, key=var.name)


def _deepspeed_num_gpus_command(launch: Launch, ws):
    """The ``deepspeed --num_gpus N`` command the world size was read from, if that is how it was launched."""
    for lc in launch.commands:
        if lc.launcher == "deepspeed" and _IGNORING_FLAGS & set(lc.flags) and \
                (ws.line is None or (lc.command.file == ws.file and lc.command.line == ws.line)):
            return lc
    return None


# deepspeed/launcher/runner.py: any of these makes the launcher ignore (and delete) CUDA_VISIBLE_DEVICES.
_IGNORING_FLAGS = {"num_gpus", "num_accelerators", "include", "exclude"}


def _deepspeed_ignores_visible(lc, ws) -> Iterator[Hit]:
    var, n = ws.visible_var, ws.nproc_per_node
    listed = [p.strip() for p in var.value.split(",") if p.strip()]
    include = (lc.flags.get("include") or (None,))[0]
    if include and ":" in include and "@" not in include:
        physical = [p.strip() for p in include.split(":", 1)[1].split(",") if p.strip()]
    else:
        physical = [str(i) for i in range(n)]
    if listed == physical:
        return
    flag = next(f for f in ("num_gpus", "num_accelerators", "include", "exclude") if f in lc.flags)
    where = "including GPUs you did not list" if len(physical) > len(listed) else f"instead of {var.value}"
    yield Hit(None, None, f"`deepspeed --{flag}` ignores {var.name}={var.value}: DeepSpeed's launcher deletes "
                          f"the variable when --num_gpus/--include/--exclude is given and starts its ranks on "
                          f"physical GPUs {','.join(physical)}, {where} — drop --{flag} (DeepSpeed then uses exactly "
                          f"the listed devices) or write --include localhost:{var.value}",
              file=lc.command.file, line=lc.command.line, key=flag)


@rule("SH003", "launch-config-missing", Severity.ERROR, versions="all",
      witness="tests/rules/test_launch_script.py::test_sh003_witness")
def launch_config_missing(launch: Launch) -> Iterator[Hit]:
    """A launch command names a config file that does not exist.

    ## Why is this bad?
    The launch starts, waits for the processes to come up, and fails: `llamafactory-cli train
    missing.yaml`, `accelerate launch --config_file missing.yaml` or `--deepspeed missing.json` (the
    Trainer raises `ValueError: Expected a string path to an existing deepspeed config` when it builds
    its arguments). Often a path relative to another working directory.

    ## Example
    ```bash
    llamafactory-cli train configs/sft.yaml   # run from a folder without configs/
    ```

    ## Use instead
    ```bash
    cd "$(dirname "$0")" && llamafactory-cli train configs/sft.yaml
    ```

    ## References
    - `transformers/integrations/deepspeed.py` `HfDeepSpeedConfig` (path check)
    """
    scripts = {s.path for s in launch.scripts}
    for ref in launch.references:
        if ref.resolved is not None or ref.source not in scripts:
            continue
        yield Hit(None, None, f"{ref.key} names {ref.target!r}, which does not exist relative to the script or "
                              "the current folder: the launch fails after it starts; fix the path.",
                  file=ref.source, line=ref.line, key=ref.key)
