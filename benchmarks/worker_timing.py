"""What isolation costs: worker start-up, one forward request, the whole catalogue.

    .venv/bin/python benchmarks/worker_timing.py [--repeats 3] [--sandbox auto] [--start-up-only]

Start-up is measured from asking for a worker to its first frame (started: interpreter,
``import torch``, the suite; forked by the zygote: a fork) and then the ``load`` request
(importing the submission), the first worker apart (it starts the zygote);
``ATTENTION_CONFORMANCE_WARM_START=0`` measures started workers only; a forward
round trip against ``ModuleInstance.forward`` in this process at a small and a medium size; the
full quick-profile catalogue on the textbook attention (``conformance/implementations/mutants/textbook.py``)
isolated against in-process, with the CPU each side spent (where isolation's time goes). torch
runs on one thread on both sides. Medians are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from conformance import Config, Runner
from conformance.implementations.mutants.textbook import IMPLEMENTATIONS
from conformance.subject.boundary import Inputs
from conformance.subject.in_process import InProcessSubject
from conformance.worker import IsolatedSubject
from conformance.worker.sandbox import resolve_kind

TEXTBOOK = Path(__file__).resolve().parents[1] / "conformance" / "implementations" / "mutants" / "textbook.py"


def median_time(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def start_up(sandbox: str, repeats: int) -> None:
    ready, loaded, forked = [], [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with IsolatedSubject(TEXTBOOK, "textbook.py::IMPLEMENTATIONS", name="textbook",
                             sandbox=sandbox) as subject:
            loaded.append(time.perf_counter() - start)
            ready.append(subject._worker.startup_seconds)
            forked.append(subject._worker.forked)
    first, ready, loaded = loaded[0], ready[1:], loaded[1:]
    inferred = []
    for _ in range(repeats):
        start = time.perf_counter()
        with IsolatedSubject(TEXTBOOK, "textbook.py::TextbookAttention", sandbox=sandbox):
            inferred.append(time.perf_counter() - start)
    how = "forked by the zygote" if all(forked[1:]) else "started"
    print(f"start-up ({sandbox}, {how}): the first worker {first:.2f} s (the zygote's start "
          f"included when forked); each later one: to its first frame "
          f"{statistics.median(ready):.3f} s, "
          f"+ load {statistics.median(loaded) - statistics.median(ready):.3f} s, "
          f"total {statistics.median(loaded):.3f} s; the undeclared class (inferred in the "
          f"worker) {statistics.median(inferred):.3f} s (medians of {repeats})")


def requests(sandbox: str) -> None:
    (textbook, _) = IMPLEMENTATIONS
    with IsolatedSubject(TEXTBOOK, "textbook.py::IMPLEMENTATIONS", name="textbook",
                         sandbox=sandbox) as subject:
        for batch, length, d_model, heads in ((2, 5, 8, 2), (4, 128, 64, 4)):
            config = Config(batch=batch, q_len=length, kv_len=length, d_model=d_model,
                            num_heads=heads)
            x = torch.randn(batch, length, d_model)
            inputs = Inputs(x, x.clone(), x.clone(), keep=torch.rand(batch, length) > 0.2)
            local = InProcessSubject(textbook).instantiate(config, 0)
            remote = subject.instantiate(config, 0)
            calls = 2000 if length < 100 else 300
            for instance in (local, remote):
                for _ in range(20):
                    instance.forward(inputs)
            here = median_time(lambda i=local, x=inputs: i.forward(x), calls)
            there = median_time(lambda i=remote, x=inputs: i.forward(x), calls)
            print(f"forward (B={batch}, L={length}, d={d_model}, H={heads}): in-process "
                  f"{here * 1e6:.0f} us, isolated {there * 1e6:.0f} us, "
                  f"overhead {(there - here) * 1e6:.0f} us per request")
        instance = subject.instantiate(Config(batch=1, q_len=1, kv_len=1, d_model=2,
                                              num_heads=1), 0)
        empty = median_time(lambda: instance.stdout, 2000)
        print(f"empty request (stdout): {empty * 1e6:.0f} us round trip")


def _cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _worker_pid(subject: IsolatedSubject) -> int | None:
    """The worker's pid: the supervisor's one child, where this process can see it (not in a
    pid namespace of its own)."""
    supervisor = subject._worker.pid
    try:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def catalogue(sandbox: str, repeats: int) -> None:
    """The catalogue's wall time in process and isolated, one process each (no forks), and where
    isolation's CPU goes: this process's (hypothesis, the references, encoding requests) and the
    worker's (the implementation, decoding, restoring torch, encoding replies). Their sum against
    the wall time says whether the two sides wait for each other (batching round trips would
    help) or take turns computing (only cheaper requests would)."""
    (textbook, _) = IMPLEMENTATIONS
    start = os.times()
    here = median_time(lambda: Runner("quick").run(InProcessSubject(textbook), devices=["cpu"]),
                       repeats)
    here_cpu = (os.times().user + os.times().system - start.user - start.system) / repeats
    with IsolatedSubject(TEXTBOOK, "textbook.py::IMPLEMENTATIONS", name="textbook",
                         sandbox=sandbox) as subject:
        worker = _worker_pid(subject)
        Runner("quick").run(subject, devices=["cpu"])  # the worker's first calls warm it
        start, worker_start = os.times(), _cpu_seconds(worker) if worker else 0.0
        there = median_time(lambda: Runner("quick").run(subject, devices=["cpu"]), repeats)
        checker_cpu = (os.times().user + os.times().system - start.user - start.system) / repeats
        worker_cpu = (_cpu_seconds(worker) - worker_start) / repeats if worker else None
    print(f"full catalogue on textbook (quick, cpu): in-process {here:.2f} s, isolated "
          f"{there:.2f} s ({there / here:.2f}x; start-up not included)")
    split = (f"the worker {worker_cpu:.2f} s, together {checker_cpu + worker_cpu:.2f} s"
             if worker_cpu is not None else "the worker's not visible from here")
    print(f"CPU per catalogue: in-process {here_cpu:.2f} s; isolated: this process "
          f"{checker_cpu:.2f} s, {split}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sandbox", default="auto",
                        choices=("auto", "filesystem", "bwrap", "landlock", "unshare", "none"))
    parser.add_argument("--start-up-only", action="store_true", help="measure start-up only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sandbox = resolve_kind(args.sandbox)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    start_up(sandbox, max(args.repeats, 5))
    if args.start_up_only:
        return
    requests(sandbox)
    catalogue(sandbox, args.repeats)


if __name__ == "__main__":
    main()
