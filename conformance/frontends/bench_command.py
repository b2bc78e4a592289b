"""``attention-conformance bench``: the implementations' speed beside SDPA, by sequence length
(a forward, or forward and backward), or per decoded token with a KV cache (``--decode``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from conformance.benchmark import noise
from conformance.benchmark.backends import backend_rows
from conformance.benchmark.decode import decode_bench, decode_table
from conformance.benchmark.ladder import bench
from conformance.benchmark.render import plot, plot_available, table, to_json
from conformance.frontends.command_targets import resolved_targets
from conformance.frontends.exit_codes import EXIT_OK, UsageError
from conformance.frontends.report import wrap
from conformance.generation.cases import DTYPES
from conformance.generation.strategies import available_devices
from conformance.loading.registry import registered
from conformance.model.spec import Implementation


def run_bench(args: argparse.Namespace) -> int:
    from conformance.implementations.reference_sdpa import IMPLEMENTATION as SDPA

    if args.impls:
        implementations = [impl for _, impl in resolved_targets(args.impls)]
    else:
        implementations = [impl for impl in registered().values() if impl.benchmark and (
            impl.capabilities.cache.style is not None or not args.decode)]
    if args.decode:
        return _bench_decode(args, implementations)
    if args.backends:
        implementations += backend_rows(SDPA)
    try:
        lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError as error:
        raise UsageError(f"--lengths {args.lengths!r}: give comma-separated integers") from error
    if args.device not in available_devices():
        raise UsageError(f"--device {args.device}: not available on this machine")
    if args.plot and not plot_available():  # before the run, not after it
        raise UsageError("--plot needs matplotlib: pip install 'attention-conformance[plot]' "
                         "(in a source checkout: pip install -e '.[plot]')")
    if args.threads < 1:
        raise UsageError(f"--threads {args.threads}: give at least 1")
    mode = "forward + backward" if args.backward else "forward (eval, no_grad)"
    heading = wrap(f"attention-conformance bench · {mode} · {args.dtype} · {args.device} · batch "
                   f"{args.batch}, {args.heads} heads x {args.head_dim} · {args.threads} torch "
                   f"thread(s) · median of {args.rounds} calls, interleaved with SDPA · torch "
                   + torch.__version__)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    loads = [noise.load_average()]
    try:
        points = bench(implementations, SDPA, lengths=lengths, batch=args.batch,
                       heads=args.heads, head_dim=args.head_dim, dtype=DTYPES[args.dtype],
                       device=args.device, backward=args.backward, budget=args.budget,
                       rounds=args.rounds)
    finally:
        torch.set_num_threads(previous_threads)
    loads.append(noise.load_average())
    print(table(points, heading))
    doubts = noise.warnings(points, load=max((x for x in loads if x is not None), default=None),
                            cores=os.cpu_count() or 1, threads=args.threads)
    if doubts:
        print("\n" + wrap("warning: these figures may be noise: " + "; ".join(doubts) + ". "
                          "Compare ratios measured in one run, rerun on an idle machine or with "
                          "more --rounds."), file=sys.stderr)
    if args.json:
        payload = to_json(points, _settings(args, lengths=lengths))
        payload["noise"] = doubts
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    if args.plot:
        plot(points, str(args.plot), heading)
    return EXIT_OK


def _bench_decode(args: argparse.Namespace, implementations: list[Implementation]) -> int:
    try:
        contexts = [int(n) for n in args.contexts.split(",")]
    except ValueError as error:
        raise UsageError(f"--contexts {args.contexts!r}: give comma-separated integers") from error
    if args.device not in available_devices():
        raise UsageError(f"--device {args.device}: not available on this machine")
    heading = (f"attention-conformance bench --decode · one token per call, eval, no_grad, one "
               f"torch thread · "
               f"{args.dtype} · {args.device} · batch {args.batch}, {args.heads} heads x "
               f"{args.head_dim} · median of {args.rounds} calls, interleaved with SDPA over a "
               "concatenated cache · torch " + torch.__version__)
    points = decode_bench(implementations, contexts=contexts, batch=args.batch,
                          heads=args.heads, head_dim=args.head_dim, dtype=DTYPES[args.dtype],
                          device=args.device, rounds=args.rounds)
    print(decode_table(points, heading))
    if args.json:
        args.json.write_text(json.dumps({"settings": _settings(args, contexts=contexts),
                                         "points": [p.to_dict() for p in points]}, indent=2)
                             + "\n")
    return EXIT_OK


def _settings(args: argparse.Namespace, **parsed: object) -> dict[str, object]:
    """The run's settings as JSON values of their own types (``"batch": 2``, ``"backward":
    false``, ``"lengths": [32, 64]``), ``parsed`` over the raw command-line strings."""
    def plain(value: object) -> object:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return str(value)  # a path, a dtype name's object: its text

    settings = {k: plain(v) for k, v in vars(args).items() if k not in ("json", "plot")}
    settings.update({k: plain(v) for k, v in parsed.items()})
    return settings
