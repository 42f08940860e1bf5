"""scripts/attention/host_path_cpu.py: it runs our Function's Python path on CPU tensors with the
launches stubbed (in a subprocess: it patches modules, and needs TRITON_INTERPRET unset), and it
refuses bad arguments with one line naming the flag."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "attention" / "host_path_cpu.py"


def _run(*args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the checkout's package, installed or not (the script's own directory is what Python puts first)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_times_forward_and_forward_backward():
    out = _run("--seq", "128", "--number", "2", "--repeat", "1")
    assert out.returncode == 0, out.stderr
    assert "forward " in out.stdout and "forward+backward" in out.stdout and "launches stubbed" in out.stdout


def test_bad_arguments_exit_2_naming_the_flag():
    out = _run("--seq", "0")
    assert out.returncode == 2 and "--seq" in out.stderr.strip().splitlines()[-1]
    out = _run(interpret=True)
    assert out.returncode == 2 and "TRITON_INTERPRET" in out.stderr
