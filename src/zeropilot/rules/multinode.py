"""Rules about launches that span several nodes: node counts that disagree, a master address only the local
machine can reach, the network interface NCCL picks, LLaMA-Factory's per-node random port.

The settings come from :mod:`zeropilot.launch.multinode` (derived once per launch).
"""

from __future__ import annotations

from typing import Iterator, Optional

from zeropilot.launch import Launch
from zeropilot.launch.multinode import LOOPBACK, NodeLaunch, Setting, node_facts
from zeropilot.rules.registry import Hit, Severity, rule


def _hit(s: Optional[Setting], nl: NodeLaunch, message: str, key: Optional[str] = None) -> Hit:
    file = s.file if s is not None and s.file is not None else nl.file
    line = s.line if s is not None and s.line is not None else nl.line
    return Hit(None, None, message, file=file, line=line, key=key or (s.source if s is not None else nl.launcher))


def _mismatches(nl: NodeLaunch) -> Iterator[Hit]:
    """Each way this command's node count disagrees with itself (see MN001)."""
    one_launcher_per_node = nl.tasks_per_node is not None and nl.tasks_per_node.value == 1
    if (nl.launcher in ("torchrun", "accelerate", "llamafactory") and nl.scheduler_nodes is not None
            and one_launcher_per_node):
        nnodes = nl.nnodes.value if nl.nnodes is not None else 1
        if nnodes != nl.scheduler_nodes.value:
            said = f"{nl.nnodes.source} {nnodes}" if nl.nnodes is not None else f"{nl.launcher}'s default of 1 node"
            yield _hit(nl.nnodes or nl.scheduler_nodes, nl,
                       f"{said}, but {nl.scheduler_nodes.source} {nl.scheduler_nodes.value} with one task per node "
                       f"starts {nl.scheduler_nodes.value} launchers: "
                       + ("they wait in the rendezvous for nodes that never come, until it times out"
                          if nnodes > nl.scheduler_nodes.value else
                          "the extra launchers form rendezvous of their own (or are refused), not one job")
                       + f"; make them equal (e.g. --nnodes $SLURM_NNODES).")
    if nl.standalone is not None and nl.nnodes is not None and nl.nnodes.value > 1:
        yield _hit(nl.standalone, nl, f"torchrun --standalone with {nl.nnodes.source} {nl.nnodes.value}: "
                                      "--standalone runs the rendezvous on this machine's localhost, so the "
                                      "other nodes can never join and the job waits until the rendezvous times "
                                      "out; drop --standalone and give --rdzv_endpoint HOST:PORT (or "
                                      "--master_addr) of node 0.")
    hf = nl.hostfile
    if hf is not None and hf.error:
        yield _hit(Setting(str(hf.path), "deepspeed --hostfile", nl.file, nl.line), nl,
                   f"deepspeed --hostfile {hf.path}: {hf.error}"
                   + ("; with --num_nodes above 1 DeepSpeed stops ('Num nodes is >1 but no extra nodes available "
                      "via hostfile')" if hf.missing and nl.num_nodes is not None and nl.num_nodes.value > 1 else "")
                   + ".")
    elif hf is not None and nl.num_nodes is not None and nl.num_nodes.value > len(hf.hosts):
        yield _hit(nl.num_nodes, nl, f"deepspeed --num_nodes {nl.num_nodes.value} but the hostfile lists "
                                     f"{len(hf.hosts)} host(s): DeepSpeed keeps the first --num_nodes hosts and "
                                     f"says nothing, so the job runs on {len(hf.hosts)} node(s) with a smaller "
                                     "world size (and global batch) than planned; add the hosts or lower "
                                     "--num_nodes.")
    if nl.launcher == "accelerate" and nl.nnodes is not None and nl.nnodes.value > 1:
        total = nl.command.flags.get("num_processes", (None, 0))[0]
        n = int(total) if isinstance(total, str) and total.isdigit() else None
        if n is not None and n % nl.nnodes.value:
            yield _hit(nl.nnodes, nl, f"accelerate launch --num_processes {n} is the total over all machines, "
                                      f"and {n} does not split over {nl.nnodes.value} machines: accelerate starts "
                                      f"{n // nl.nnodes.value} per machine and the world is not what was asked; "
                                      "give the total (machines x processes per machine).")


@rule("MN001", "node-count-mismatch", Severity.ERROR, packages=("torch", "deepspeed"), versions="all",
      witness="tests/rules/test_multinode.py::test_mn001_mn002_witness")
def node_count_mismatch(launch: Launch) -> Iterator[Hit]:
    """The launch's node count disagrees with itself: `--nnodes` against the nodes Slurm starts launchers on,
    `torchrun --standalone` across nodes, a DeepSpeed hostfile that is missing, malformed or shorter than
    `--num_nodes`, or an accelerate `--num_processes` that does not split over `--num_machines`.

    ## Why is this bad?
    A rendezvous waits for exactly the nodes it was told about. With `--nnodes 2` and one launcher (a one-node
    allocation, `--standalone`, a node that never starts) the ranks wait until the rendezvous timeout (torchrun:
    `DistStoreError: Timed out after ... waiting for clients. 1/2 clients joined`; 15 minutes by default), holding
    every GPU. The other way round, surplus launchers form jobs of their own. DeepSpeed's runner trains on the local
    machine only when `--hostfile` names a missing file, refuses a malformed one, and keeps the first `--num_nodes`
    hosts without a word when the hostfile has fewer: a smaller world size and global batch than planned.

    ## Example
    ```bash
    #SBATCH --nodes=4
    #SBATCH --ntasks-per-node=1
    srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_endpoint node0:29500 train.py
    deepspeed --hostfile hostfile --num_nodes 4 train.py     # hostfile lists 2 hosts
    ```

    ## Use instead
    ```bash
    srun torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint node0:29500 train.py
    deepspeed --hostfile hostfile train.py                    # every host of the hostfile
    ```

    ## References
    - `torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py` (the master's `TCPStore` waits for
      `--nnodes` clients); `torch/distributed/run.py` `--standalone` (`rdzv_endpoint=localhost:0`)
    - `deepspeed/launcher/runner.py`: `fetch_hostfile` ("Unable to find hostfile, will proceed with training with
      local resources only"), `_parse_hostfile`, `apply_num_nodes_and_gpus`
    - `accelerate/commands/launch.py`: `--num_processes` is the total over all machines
    """
    for nl in node_facts(launch).commands:
        yield from _mismatches(nl)


def _loopback(value) -> bool:
    host = str(value).strip().lower()
    if host.startswith("["):  # [::1]:29500
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # localhost:29500
        host = host.split(":", 1)[0]
    return host in LOOPBACK or host.startswith("127.")


@rule("MN002", "master-address-is-loopback", Severity.WARNING, packages=("torch",), versions="all",
      witness="tests/rules/test_multinode.py::test_mn001_mn002_witness")
def master_address_is_loopback(launch: Launch) -> Iterator[Hit]:
    """A launch across nodes whose master address (or rendezvous endpoint) is `localhost`/`127.0.0.1`, given or
    left to a default that is.

    ## Why is this bad?
    Every node connects to the address it is given, as it is: `127.0.0.1` on node 1 is node 1 itself, where no
    rendezvous listens, so its ranks retry until the rendezvous timeout while node 0 waits for them. torchrun's
    `--master_addr` defaults to `127.0.0.1`, and LLaMA-Factory's launcher passes `MASTER_ADDR` or `127.0.0.1`.
    Only a job whose "nodes" are launchers on one machine (a test) works this way.

    ## Example
    ```bash
    torchrun --nnodes 2 --node_rank $NODE_RANK --master_addr 127.0.0.1 --master_port 29500 train.py
    FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=$NODE_RANK MASTER_PORT=29500 llamafactory-cli train sft.yaml
    ```

    ## Use instead
    ```bash
    torchrun --nnodes 2 --node_rank $NODE_RANK --master_addr node0.cluster --master_port 29500 train.py
    FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=$NODE_RANK MASTER_ADDR=node0.cluster MASTER_PORT=29500 llamafactory-cli train sft.yaml
    ```

    ## References
    - `torch/distributed/run.py` (`--master-addr` default `127.0.0.1`); `static_tcp_rendezvous.py` (`TCPStore`
      client to `master_addr`)
    - LLaMA-Factory `src/llamafactory/launcher.py` / `cli.py`: `os.getenv("MASTER_ADDR", "127.0.0.1")`
    """
    for nl in node_facts(launch).commands:
        if (nl.node_count or 1) <= 1:
            continue
        master, nodes = nl.master, nl.nnodes or nl.scheduler_nodes
        if master is None and nl.launcher in ("torchrun", "llamafactory") and nl.standalone is None:
            yield _hit(nodes, nl, f"{nodes.source} {nodes.value} and no master address: "
                                      f"{nl.launcher} then uses 127.0.0.1, which on every other node is that node "
                                      "itself; give node 0's address (--master_addr or MASTER_ADDR).")
        elif master is not None and _loopback(master.value):
            yield _hit(master, nl, f"{master.source} {master.value} for a job on {nl.node_count} nodes: every node "
                                   "connects to itself there, and the others wait for it until the rendezvous "
                                   "times out; give an address of node 0 that the other nodes reach (works only "
                                   "when every launcher runs on this one machine).")


@rule("MN003", "nccl-socket-interface-unset", Severity.INFO, packages=("torch",), versions="all",
      witness="fixture:tests/rules/test_multinode.py::test_mn003_fires_only_across_nodes; NCCL environment "
              "variables (NCCL_SOCKET_IFNAME: default 'ib* first, then any interface but lo and docker*'); no CPU "
              "witness: NCCL needs GPUs, and the choice matters only on hosts with several interfaces")
def nccl_socket_interface_unset(launch: Launch) -> Iterator[Hit]:
    """A launch across nodes that leaves `NCCL_SOCKET_IFNAME` unset (information: it matters on hosts with several
    network interfaces).

    ## Why is this bad?
    For its bootstrap and socket transport NCCL picks an interface by itself: `ib*` first, then any interface but
    `lo` and `docker*`. On a host with several (a management network, a container bridge, a second NIC) it may
    pick one the other nodes cannot reach or the slow one: the job hangs in its first collective or runs at a
    fraction of the network's speed. gloo (CPU groups) has the same choice, `GLOO_SOCKET_IFNAME`. On hosts with one
    interface nothing changes; that is why this is information, not a warning.

    ## Example
    ```bash
    torchrun --nnodes 2 --node_rank $NODE_RANK --master_addr node0 train.py
    ```

    ## Use instead
    ```bash
    export NCCL_SOCKET_IFNAME=eth0        # the interface the nodes reach each other on (`ip -br addr`)
    torchrun --nnodes 2 --node_rank $NODE_RANK --master_addr node0 train.py
    ```

    ## References
    - NCCL documentation, Environment Variables: `NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`
    - PyTorch distributed documentation: "Choosing the network interface to use" (`NCCL_SOCKET_IFNAME`,
      `GLOO_SOCKET_IFNAME`)
    """
    nf = node_facts(launch)
    if not nf.spans_nodes or nf.setting("NCCL_SOCKET_IFNAME") is not None:
        return
    for nl in nf.commands:
        if (nl.node_count or 1) > 1:
            nodes = nl.nnodes or nl.scheduler_nodes
            yield _hit(nodes, nl, f"the job spans {nl.node_count} nodes ({nodes.source}) and NCCL_SOCKET_IFNAME "
                                  "is not set: NCCL picks the interface itself (ib* first, then any but lo and "
                                  "docker*); on hosts with several interfaces set it to the one the nodes reach "
                                  "each other on (e.g. export NCCL_SOCKET_IFNAME=eth0).", key="NCCL_SOCKET_IFNAME")
            return


@rule("MN004", "llamafactory-random-master-port", Severity.ERROR, packages=("llamafactory",), versions="all",
      witness="fixture:tests/rules/test_multinode.py::test_mn004_fires_without_master_port; LLaMA-Factory "
              "launcher: master_port = os.getenv('MASTER_PORT', str(find_available_port())); not installed here")
def llamafactory_random_master_port(launch: Launch) -> Iterator[Hit]:
    """`llamafactory-cli train` with `NNODES` above 1 and no `MASTER_PORT`.

    ## Why is this bad?
    LLaMA-Factory's launcher passes `--master_port` from `MASTER_PORT`, else a free port it finds on the node it
    runs on. Each node finds its own, so node 0 listens on one port and the others connect to another: the
    rendezvous never forms and the job waits until it times out.

    ## Example
    ```bash
    FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=$NODE_RANK MASTER_ADDR=node0 llamafactory-cli train sft.yaml
    ```

    ## Use instead
    ```bash
    FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=$NODE_RANK MASTER_ADDR=node0 MASTER_PORT=29500 llamafactory-cli train sft.yaml
    ```

    ## References
    - LLaMA-Factory `src/llamafactory/cli.py` / `launcher.py`: `os.getenv("MASTER_PORT", str(find_available_port()))`
    """
    for nl in node_facts(launch).commands:
        if nl.launcher == "llamafactory" and (nl.node_count or 1) > 1 and nl.master_port is None:
            yield _hit(nl.nnodes, nl, f"NNODES={nl.nnodes.value} without MASTER_PORT: LLaMA-Factory picks a free port "
                                      "on each node, so the nodes look for each other on different ports and the "
                                      "rendezvous never forms; export the same MASTER_PORT (e.g. 29500) on every "
                                      "node.", key="MASTER_PORT")
