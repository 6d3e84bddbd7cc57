"""numpy's run-time kernels: pinned to its baseline by the ``sedsynth`` command, checked on remote workers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import determinism
from pipeline.compute import ComputeError, _check_kernels

PINNABLE = determinism.baseline_group() is not None
KERNELS = "from pipeline.determinism import numpy_kernels; import numpy; print(numpy_kernels())"


def _kernels_in_fresh_python(code: str, **environ: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != determinism.VARIABLE} | environ
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not PINNABLE, reason="numpy's kernels are pinned on x86-64 with numpy >= 2.4 only")
def test_the_command_pins_numpy_to_its_baseline_before_numpy_loads() -> None:
    assert _kernels_in_fresh_python(f"import sedsynth; {KERNELS}") == "baseline"
    # numpy loaded first cannot be pinned any more: the variable is left alone and the kernels say so
    assert (
        _kernels_in_fresh_python(
            f"import numpy, os, sedsynth; print(os.environ.get('{determinism.VARIABLE}')); {KERNELS}"
        ).splitlines()[0]
        == "None"
    )


def test_a_users_own_setting_is_kept() -> None:
    code = f"import os, sedsynth; print(os.environ['{determinism.VARIABLE}'])"
    assert _kernels_in_fresh_python(code, **{determinism.VARIABLE: "X86_V3"}) == "X86_V3"


class _Cluster:
    """``client.run`` of a cluster whose two workers report the given kernels."""

    def __init__(self, kernels: list[str]):
        self.kernels = kernels

    def run(self, fn):
        assert fn is determinism.numpy_kernels
        return {f"tcp://10.0.0.{i}:4000": k for i, k in enumerate(self.kernels)}


def test_remote_workers_with_other_kernels_are_refused_with_the_fix() -> None:
    here = determinism.numpy_kernels()
    _check_kernels(_Cluster([here, here]), "tcp://scheduler:8786")  # the same kernels everywhere: accepted
    other = "baseline" if here != "baseline" else "X86_V3 X86_V4"
    with pytest.raises(
        ComputeError,
        match=f"1 of its dask workers \\(e.g. tcp://10.0.0.1:4000\\) use numpy kernels '{other}'.*{determinism.VARIABLE}=",
    ):
        _check_kernels(_Cluster([here, other]), "tcp://scheduler:8786")


def test_the_tests_run_on_the_commands_kernels() -> None:
    """Tests compare in-process runs with `sedsynth` subprocesses: both must use the same kernels."""
    assert determinism.numpy_kernels() == _kernels_in_fresh_python(f"import sedsynth; {KERNELS}")


FASTEST = _kernels_in_fresh_python(KERNELS) if PINNABLE else "baseline"  # numpy's own choice on this CPU


@pytest.mark.skipif(FASTEST == "baseline", reason="needs a CPU with kernels above numpy's baseline, and numpy >= 2.4 on x86-64")
def test_real_workers_started_without_the_pin_are_refused(monkeypatch) -> None:
    from distributed import Client, LocalCluster

    monkeypatch.setenv(
        determinism.VARIABLE, FASTEST
    )  # the workers' environment: numpy's own choice (this process has loaded numpy)
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        assert set(client.run(determinism.numpy_kernels).values()) == {FASTEST}
        with pytest.raises(ComputeError, match="differ in the last bits"):
            _check_kernels(client, cluster.scheduler_address)  # this process runs on the baseline kernels
