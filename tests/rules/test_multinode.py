"""MN rules (launches across nodes) and the launch facts they read (``launch/multinode.py``)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import codes, run_check
from tests.runjobs import free_port

DS = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}


def _launch(launch_dir, script: str, **extra):
    return launch_dir({"ds.json": DS, "run.sh": textwrap.dedent(script), **extra})


def _facts(root):
    from zeropilot.launch import load_launch
    from zeropilot.launch.multinode import node_facts

    launch = load_launch([root], use_installed=False)
    return launch, node_facts(launch)


# -- the facts ---------------------------------------------------------------------------------------------------

def test_facts_read_sbatch_srun_and_torchrun(launch_dir):
    root = _launch(launch_dir, """\
        #!/bin/bash
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=1
        #SBATCH -G 8
        srun --kill-on-bad-exit=1 torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d \\
            --rdzv_endpoint node0:29500 train.py --deepspeed ds.json
        """)
    launch, nf = _facts(root)
    nl = nf.commands[0]
    assert (nl.launcher, nl.command.wrapper) == ("torchrun", "srun")
    assert (nl.nnodes.value, nl.nnodes.source) == (2, "torchrun --nnodes")
    assert (nl.scheduler_nodes.value, nl.scheduler_nodes.line) == (2, 2)
    assert nl.tasks_per_node.value == 1 and nl.master.value == "node0:29500"
    assert launch.world_size.value == 16 and nf.spans_nodes


def test_srun_python_world_is_one_rank_per_task(launch_dir):
    root = _launch(launch_dir, """\
        #SBATCH -N 2
        #SBATCH --ntasks-per-node=4
        srun python train.py --deepspeed ds.json
        """)
    launch, _ = _facts(root)
    assert launch.world_size.value == 8 and "srun" in launch.world_size.reason
    root2 = launch_dir({"ds.json": DS, "run.sh": "srun -n 6 python train.py --deepspeed ds.json\n"})
    assert _facts(root2)[0].world_size.value == 6


def test_deepspeed_hostfile_world_follows_deepspeeds_rules(launch_dir):
    root = _launch(launch_dir, "deepspeed --hostfile hosts --exclude n2 train.py --deepspeed ds.json\n",
                   hosts="# comment\nn1 slots=4\nn2 slots=4\nn3 slots=2\n")
    launch, nf = _facts(root)
    assert launch.world_size.value == 6 and nf.commands[0].nnodes.value == 2


def test_accelerate_and_llamafactory_settings(launch_dir):
    root = launch_dir({"ds.json": DS, "acc.yaml": "num_machines: 2\nmachine_rank: 1\nmain_process_ip: 10.0.0.1\n"
                                                  "num_processes: 16\ndistributed_type: DEEPSPEED\n",
                       "run.sh": "accelerate launch --config_file acc.yaml train.py\n"
                                 "NNODES=2 NODE_RANK=1 FORCE_TORCHRUN=1 llamafactory-cli train lf.yaml\n",
                       "lf.yaml": "model_name_or_path: x\nstage: sft\ndeepspeed: ds.json\n"})
    _, nf = _facts(root)
    acc, lf = nf.commands
    assert (acc.nnodes.value, acc.node_rank.value, acc.master.value) == (2, 1, "10.0.0.1")
    assert (lf.nnodes.value, lf.node_rank.value, lf.master) == (2, 1, None)


# -- MN001 ---------------------------------------------------------------------------------------------------------

def test_mn001_nnodes_against_the_allocation(launch_dir):
    root = _launch(launch_dir, """\
        #SBATCH --nodes=4
        #SBATCH --ntasks-per-node=1
        srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint node0:29500 --rdzv_backend c10d train.py
        """)
    found = run_check(root, select={"MN001"})
    assert codes(found) == ["MN001"] and "#SBATCH --nodes 4" in found[0].message and found[0].line == 3
    same = _launch(launch_dir, """\
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=1
        srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint node0:29500 --rdzv_backend c10d train.py
        """)
    assert run_check(same, select={"MN001"}) == []


def test_mn001_standalone_across_nodes(launch_dir):
    root = _launch(launch_dir, "torchrun --standalone --nnodes 2 --nproc_per_node 8 train.py\n")
    assert codes(run_check(root, select={"MN001"})) == ["MN001"]


def test_mn001_hostfile_missing_short_or_malformed(launch_dir):
    short = _launch(launch_dir, "deepspeed --hostfile hosts --num_nodes 4 train.py --deepspeed ds.json\n",
                    hosts="n1 slots=8\nn2 slots=8\n")
    found = run_check(short, select={"MN001"})
    assert codes(found) == ["MN001"] and "runs on 2 node(s)" in found[0].message
    missing = _launch(launch_dir, "deepspeed --hostfile nowhere --num_nodes 2 train.py --deepspeed ds.json\n")
    assert "Num nodes is >1" in run_check(missing, select={"MN001"})[0].message
    bad = _launch(launch_dir, "deepspeed --hostfile hosts train.py --deepspeed ds.json\n", hosts="n1 8\n")
    assert "refuses" in run_check(bad, select={"MN001"})[0].message
    good = _launch(launch_dir, "deepspeed --hostfile hosts train.py --deepspeed ds.json\n",
                   hosts="n1 slots=8\nn2 slots=8\n")
    assert run_check(good, select={"MN001"}) == []


def test_mn001_accelerate_processes_do_not_split(launch_dir):
    root = _launch(launch_dir, "accelerate launch --num_machines 2 --num_processes 3 --main_process_ip n0 t.py\n")
    assert codes(run_check(root, select={"MN001"})) == ["MN001"]


@pytest.mark.witness
@pytest.mark.slow
def test_mn001_mn002_witness(tmp_path):
    """Real torchrun, CPU: (MN001) node 0 of a 2-node job started alone waits for the node that never comes and
    times out, '1/2 clients joined'; (MN002) node 1 given --master_addr 127.0.0.1 connects to its own machine,
    where nothing listens, and times out too. Both with a 5 s rendezvous timeout; run at once."""
    script = tmp_path / "t.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = {}
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
               "--node_rank", str(node_rank), "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "--rdzv_conf", "timeout=5", str(script)]
        procs[node_rank] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            text=True, start_new_session=True)
    out = {}
    try:
        for node_rank, proc in procs.items():
            out[node_rank] = proc.communicate(timeout=120)[0]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert procs[0].returncode != 0 and "1/2 clients joined" in out[0], out[0][-2000:]
    assert procs[1].returncode != 0 and "127.0.0.1" in out[1], out[1][-2000:]


# -- MN002 ---------------------------------------------------------------------------------------------------------

def test_mn002_loopback_or_default_master(launch_dir):
    for script in ("torchrun --nnodes 2 --node_rank 0 --master_addr 127.0.0.1 --master_port 29500 train.py\n",
                   "torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint localhost:29400 train.py\n",
                   "torchrun --nnodes 2 --node_rank 1 train.py\n",
                   "export MASTER_ADDR=localhost\nFORCE_TORCHRUN=1 NNODES=2 MASTER_PORT=1 llamafactory-cli train a.yaml\n"):
        assert codes(run_check(_launch(launch_dir, script), select={"MN002"})) == ["MN002"], script
    for script in ("torchrun --nnodes 2 --master_addr node0 train.py\n",
                   "torchrun --nnodes 1 --master_addr 127.0.0.1 train.py\n",
                   "torchrun --nproc_per_node 2 train.py\n"):
        assert run_check(_launch(launch_dir, script), select={"MN002"}) == [], script


# -- MN003, MN004 --------------------------------------------------------------------------------------------------

def test_mn003_fires_only_across_nodes(launch_dir):
    across = "torchrun --nnodes 2 --master_addr node0 train.py\n"
    found = run_check(_launch(launch_dir, across), select={"MN003"})
    assert codes(found) == ["MN003"] and found[0].severity.value == "info"
    assert run_check(_launch(launch_dir, "export NCCL_SOCKET_IFNAME=eth0\n" + across), select={"MN003"}) == []
    assert run_check(_launch(launch_dir, "torchrun --nproc_per_node 8 train.py\n"), select={"MN003"}) == []


def test_mn004_fires_without_master_port(launch_dir):
    base = "FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=0 MASTER_ADDR=n0 {port}llamafactory-cli train a.yaml\n"
    assert codes(run_check(_launch(launch_dir, base.format(port="")), select={"MN004"})) == ["MN004"]
    assert run_check(_launch(launch_dir, base.format(port="MASTER_PORT=29500 ")), select={"MN004"}) == []


def test_hostile_hostfile_is_not_opened_when_not_a_file(launch_dir):
    root = _launch(launch_dir, "deepspeed --hostfile hosts --num_nodes 2 train.py --deepspeed ds.json\n")
    os.mkfifo(root / "hosts")
    found = run_check(root, select={"MN001"})  # a FIFO would block an open(): never opened
    assert codes(found) == ["MN001"] and "not a regular file" in found[0].message
