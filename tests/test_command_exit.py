"""How a command ends (``exit_codes.finish``): with its status, every exit handler of the suite
run, and torch's operator libraries left registered rather than unregistered one by one (the
process ends right after; that teardown cost every served check 20 ms)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import atexit, weakref
    import torch, torch.library
    from conformance.frontends import exit_codes

    torch_own = [f for f in list(weakref.finalize._registry)
                 if f.peek() is not None and f.peek()[1] is torch.library._del_library]

    class Owned:
        pass

    owned = Owned()
    weakref.finalize(owned, print, "the suite's finalizer ran", flush=True)
    atexit.register(print, "an exit handler ran", flush=True)

    def last():
        print(f"torch's unregistered at exit: {sum(not f.alive for f in torch_own)} "
              f"of {len(torch_own)}", flush=True)

    exit_codes.finish(3, last)
""")


def test_a_command_ends_with_its_status_its_handlers_run_and_torchs_teardown_skipped():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3, done.stderr
    lines = done.stdout.splitlines()
    assert "the suite's finalizer ran" in lines
    assert "an exit handler ran" in lines
    said = [line for line in lines if line.startswith("torch's unregistered at exit")]
    assert len(said) == 1
    count, of = said[0].rpartition(": ")[2].split(" of ")
    assert int(of) > 0, "torch registered no operator library: nothing here was tested"
    assert int(count) == 0
