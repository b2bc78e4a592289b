"""An isolated worker that may use the GPU (conformance/worker/gpu.py), with the device boundary
faked: this machine has no GPU, so what is tested is what the worker is given (device files in its
Landlock rules and its bubblewrap, a data limit in place of the address-space one, a share of the
GPU's memory, the compile limit), that a Landlock device rule does open a device, that such a
worker still runs and still runs out of memory, and who asks for one (a CUDA run, a CUDA rubric)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from worker_support import FAST, HOSTILE, needs_bwrap, needs_landlock

import conformance.worker.confine as confine
import conformance.worker.gpu as gpu
from conformance import Config, Runner
from conformance.grading.score.rubric import RubricError
from conformance.grading.score.rubric_file import parse
from conformance.subject.boundary import Inputs
from conformance.worker import IsolatedSubject, WorkerError, WorkerStatus
from conformance.worker import sandbox as sandbox_module
from conformance.worker.limits import GiB, WorkerLimits

FAKE_DEVICES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"]


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine that shows three NVIDIA device files, pinned to GPU 0."""
    monkeypatch.setattr(gpu, "device_files", lambda root="/": list(FAKE_DEVICES))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")


def _pairs(args, flag):
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


def test_the_device_files_are_found_by_pattern(tmp_path):
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia-caps", "null", "nvme0"):
        (tmp_path / "dev").mkdir(exist_ok=True)
        (tmp_path / "dev" / name).touch()
    found = [Path(p).name for p in gpu.device_files(str(tmp_path))]
    assert found == ["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "nvidia-caps"]


def test_a_cpu_worker_gets_no_device_and_keeps_its_address_space_limit(tmp_path, fake_gpu):
    launch = sandbox_module.plan(tmp_path, WorkerLimits(), "none", [])
    assert [name for name, *_ in launch.rlimits if name in ("RLIMIT_AS", "RLIMIT_DATA")] == \
        ["RLIMIT_AS"]
    assert "CUDA_VISIBLE_DEVICES" not in launch.env
    assert "--gpu-memory-bytes" not in launch.worker_args
    assert not any(p.startswith("gpu") for p in launch.protections)


def test_a_gpu_worker_gets_a_data_limit_its_gpu_and_a_share_of_its_memory(tmp_path, fake_gpu):
    limits = WorkerLimits(accelerators=True, memory_bytes=GiB, gpu_memory_bytes=8 * GiB)
    launch = sandbox_module.plan(tmp_path, limits, "none", [])
    rlimits = {name: soft for name, soft, _ in launch.rlimits}
    assert "RLIMIT_AS" not in rlimits
    assert rlimits["RLIMIT_DATA"] == sandbox_module.TORCH_ADDRESS_SPACE + GiB + gpu.DRIVER_DATA
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert _pairs(list(launch.worker_args), "--gpu-memory-bytes") == [str(8 * GiB)]
    assert "gpu: 3 nvidia device file(s) admitted" in launch.protections
    assert "gpu memory <= 8 GiB" in launch.protections
    assert "rlimit data" in launch.protections and "rlimit address space" not in \
        launch.protections


@needs_landlock
def test_landlock_admits_the_device_files_and_the_driver_read_only(tmp_path, fake_gpu):
    launch = sandbox_module.plan(tmp_path, WorkerLimits(accelerators=True), "landlock", [])
    args = list(launch.worker_args)
    assert _pairs(args, "--landlock-device") == FAKE_DEVICES
    assert set(gpu.DRIVER_READ) <= set(_pairs(args, "--landlock-read"))
    assert not set(FAKE_DEVICES) & set(_pairs(args, "--landlock-write"))
    cpu_only = sandbox_module.plan(tmp_path, WorkerLimits(), "landlock", [])
    assert "--landlock-device" not in cpu_only.worker_args


@needs_bwrap
def test_bubblewrap_binds_the_device_files_into_its_dev(tmp_path, fake_gpu):
    argv = sandbox_module.plan(tmp_path, WorkerLimits(accelerators=True), "bwrap", []).argv
    dev = argv.index("--dev")
    for path in FAKE_DEVICES:
        at = argv.index(path)
        assert argv[at - 1] == "--dev-bind-try" and at > dev  # after its own /dev is made
    assert "--dev-bind-try" not in sandbox_module.plan(tmp_path, WorkerLimits(), "bwrap", []).argv


@needs_landlock
def test_a_landlock_device_rule_opens_the_device_and_nothing_else(tmp_path):
    """/dev/full stands in for a GPU's device file: admitted as a device, it opens for writing
    (and refuses the write as a full device does); /dev/zero, not admitted, does not open."""
    program = textwrap.dedent(f"""
        import errno, sys
        sys.path.insert(0, {str(Path(confine.__file__).parent)!r})
        import confine
        confine.restrict([], [{str(tmp_path)!r}], ["/dev/full"])
        try:
            with open("/dev/full", "wb", buffering=0) as device:
                device.write(b"x")
        except OSError as error:
            print("full", errno.errorcode[error.errno])
        try:
            open("/dev/zero", "rb").close()
            print("zero opened")
        except PermissionError:
            print("zero refused")
    """)
    done = subprocess.run([sys.executable, "-I", "-S", "-c", program], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split("\n")[:2] == ["full ENOSPC", "zero refused"], done.stderr


def test_a_request_on_cuda_in_a_gpu_worker_may_compile():
    gpu_limits, cpu_limits = WorkerLimits(accelerators=True), WorkerLimits()
    on_cuda = Config(batch=1, q_len=3, kv_len=3, d_model=8, num_heads=2, device="cuda")
    on_cpu = dataclasses.replace(on_cuda, device="cpu")
    assert gpu.request_seconds(2.0, gpu_limits, on_cuda) == gpu_limits.compile_seconds
    assert gpu.request_seconds(2.0, gpu_limits, on_cpu) == 2.0
    assert gpu.request_seconds(2.0, gpu_limits, None) == 2.0
    assert gpu.request_seconds(2.0, cpu_limits, on_cuda) == 2.0


def test_a_gpu_worker_runs_and_its_data_limit_still_stops_a_memory_hog():
    """The data limit that replaces the address-space one is a limit: the hostile forward that
    asks for ever larger tensors runs out of memory under it, and the worker lives on."""
    limits = dataclasses.replace(FAST, accelerators=True)
    with IsolatedSubject(HOSTILE / "memory_hog", "attention.py::declared", limits=limits,
                         sandbox="none") as subject:
        (result,) = Runner("quick").run(subject, devices=["cpu"], checks=["gate"])
        instance = subject.instantiate(Config(batch=2, q_len=5, kv_len=5, d_model=8,
                                              num_heads=2), 0)
        with pytest.raises(WorkerError) as raised:
            instance.forward(Inputs.self_attention(torch.randn(2, 5, 8)))
        assert raised.value.status is WorkerStatus.OUT_OF_MEMORY and not raised.value.fatal
        assert "rlimit data" in subject.protections
    limit = (sandbox_module.TORCH_ADDRESS_SPACE + FAST.memory_bytes + gpu.DRIVER_DATA) / GiB
    assert result.reason.endswith(f"under the worker's {limit:.1f} GiB data limit (RuntimeError)")


def test_an_isolated_cuda_run_opens_its_worker_on_the_gpu(monkeypatch):
    """Where the run asks for cuda and the machine has it, the worker is opened with the GPU;
    a CPU run on the same machine opens it without."""
    import conformance.run.isolated as isolated
    import conformance.worker.local as local
    from conformance.worker.errors import WorkerStartError

    asked: list[bool] = []

    def open_all(spec, declared=None, **options):
        asked.append(options["accelerators"])
        raise WorkerStartError(WorkerStatus.CRASHED, "stopped here by the test")

    monkeypatch.setattr(local, "open_all", open_all)
    monkeypatch.setattr(isolated, "available_devices", lambda: ["cpu", "cuda"])
    for devices in (["cuda"], None, ["cpu"]):
        with pytest.raises(isolated.BadInput, match="stopped here by the test"):
            isolated.isolated_results(Runner("quick"), "x.py::f", isolated.Isolated(), None,
                                      devices, ["gate"], {})
    assert asked == [True, True, False]


RUBRIC = """
[assignment]
name = "gpu"
{device}
[[targets]]
class = "Attention"
[[targets.items]]
check = "gate"
points = 1
"""


def test_a_rubric_grades_on_cuda_by_saying_so(tmp_path):
    import tomllib

    def rubric(line):
        return parse(tomllib.loads(RUBRIC.format(device=line)), tmp_path / "rubric.toml")

    assert rubric("").device == "cpu"
    on_cuda = rubric('device = "cuda"')
    assert on_cuda.device == "cuda"
    assert on_cuda.execution_key() != rubric("").execution_key()  # results don't carry over
    with pytest.raises(RubricError, match=r"device 'tpu': choose one of cpu, cuda"):
        rubric('device = "tpu"')


def test_a_cuda_rubric_on_a_grader_without_a_gpu_is_one_line(tmp_path, monkeypatch):
    import tomllib

    import conformance.grading.pipeline as pipeline

    monkeypatch.setattr(pipeline, "available_devices", lambda: ["cpu"])
    rubric = parse(tomllib.loads(RUBRIC.format(device='device = "cuda"')), tmp_path / "r.toml")
    (tmp_path / "class").mkdir()
    with pytest.raises(RubricError, match=r'device "cuda": this machine has no CUDA GPU'):
        pipeline.grade_class(tmp_path / "class", rubric, tmp_path / "out", sandbox="none")
