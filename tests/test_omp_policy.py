"""The package sets OMP_WAIT_POLICY=PASSIVE before torch loads (unless the user set a policy),
so training does not collapse when another CPU-bound process shares the cores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Import the package (or the benchmarks), then torch, and report the policy torch's OpenMP saw.
PROBE = "import {module}, os, torch; print(os.environ.get('OMP_WAIT_POLICY'))"


def _policy_after_import(module: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


@pytest.mark.parametrize("module", ["smelt_interp", "benchmarks"])
def test_import_sets_passive_policy(module: str) -> None:
    assert _policy_after_import(module, None) == "PASSIVE"


def test_user_policy_is_kept() -> None:
    assert _policy_after_import("smelt_interp", "ACTIVE") == "ACTIVE"
