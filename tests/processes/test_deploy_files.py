"""The deployment files in ``deploy/`` are checked, not just shown (docs/how-to/deploy.md).

* the systemd unit passes ``systemd-analyze verify`` without a word;
* the Dockerfile passes hadolint, and its ``ENTRYPOINT`` is run here as a non-root user,
  stopped with SIGTERM while a pass is in flight: the pass finishes, the exit status is 0;
* the Kubernetes manifests validate against the API schema (``kubernetes-validate``, whose
  schemas ship in the package, so no network is needed), and the Deployment's liveness
  command is run against a fresh, a stale and a missing heartbeat file;
* the numbers that must agree across the files do: the drain timeout, the stop timeouts
  above it, the heartbeat file.

A missing tool skips a test locally, with the reason; under CI it fails it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import jobrun
from jobrun._cli import heartbeat
from jobrun.sql.schema import job_runs
from tests.support import IN_CI, JOBRUN, REPO

DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "jobrun-worker.service"
DOCKERFILE = DEPLOY / "Dockerfile"
KUBERNETES = DEPLOY / "kubernetes"
APP = "tests.processes.worker_app:registry"
# The unit's ExecStart names where an installation puts jobrun; verify needs it to exist.
UNIT_JOBRUN = "/opt/jobrun/venv/bin/jobrun"
NOBODY = 65534
# Above the drain, for the hand-backs and closing connections (the files say 30 s).
STOP_MARGIN_S = 10


def tool(name: str, *, beside_python: bool = False) -> str:
    """The path of a command-line tool; missing, it skips the test (fails it under CI)."""
    found = Path(sys.executable).with_name(name) if beside_python else None
    if found is not None and found.exists():
        return str(found)
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (see the dev extra in pyproject.toml)"
        if IN_CI:
            pytest.fail(f"under CI: {message}")
        pytest.skip(message)
    return path


def run(*command: str, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, **options)


# --- reading the files ----------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def dockerfile(instruction: str) -> list[str]:
    return [arguments for name, arguments in dockerfile_instructions() if name == instruction]


def unit_settings() -> dict[str, str]:
    """The unit's ``Key=value`` lines (the last one wins, as in systemd)."""
    text = UNIT.read_text(encoding="utf-8").replace("\\\n", " ")
    found = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def manifests() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            found[document["kind"]] = document
    return found


def worker_container() -> dict[str, Any]:
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return dict(container)


def option(arguments: list[str], name: str) -> str:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in a command line."""
    for index, argument in enumerate(arguments):
        if argument == name:
            return arguments[index + 1]
        if argument.startswith(name + "="):
            return argument.partition("=")[2]
    raise AssertionError(f"{name} not in {arguments}")


def drain_timeouts() -> dict[str, float]:
    return {
        "unit": float(option(shlex.split(unit_settings()["ExecStart"]), "--drain-timeout")),
        "Dockerfile": float(option(json.loads(dockerfile("CMD")[0]), "--drain-timeout")),
        "Deployment": float(option(worker_container()["args"], "--drain-timeout")),
    }


# --- systemd --------------------------------------------------------------------------------


def test_the_systemd_unit_verifies_cleanly(tmp_path: Path):
    analyze = tool("systemd-analyze")
    # verify checks that ExecStart's program exists: point it at this venv's jobrun.
    text = UNIT.read_text(encoding="utf-8")
    assert UNIT_JOBRUN in text
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(UNIT_JOBRUN, str(JOBRUN)), encoding="utf-8")
    checked = run(analyze, "verify", str(unit))
    # verify exits 0 on an unknown key or a bad value ("ignoring"): silence is the pass.
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")


def test_the_unit_stops_with_sigterm_and_waits_out_the_drain():
    settings = unit_settings()
    assert settings["KillSignal"] == "SIGTERM"
    assert settings["User"] == "jobrun"
    assert settings["Restart"] == "on-failure"
    assert settings["EnvironmentFile"].startswith("/etc/")
    assert "JOBRUN_DATABASE_URL" in UNIT.read_text(encoding="utf-8")
    drain_s = drain_timeouts()["unit"]
    assert float(settings["TimeoutStopSec"]) >= drain_s + STOP_MARGIN_S


# --- the container image --------------------------------------------------------------------


def test_the_dockerfile_passes_hadolint(tmp_path: Path):
    hadolint = tool("hadolint", beside_python=True)
    checked = run(hadolint, "--no-color", str(DOCKERFILE))
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")
    # And hadolint does find something when there is something to find.
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN pip install jobrun\n", encoding="utf-8")
    assert run(hadolint, "--no-color", str(careless)).returncode != 0


def test_the_image_is_slim_non_root_and_stops_with_sigterm():
    (base,) = dockerfile("FROM")
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", base), base
    (user,) = dockerfile("USER")
    assert user.split(":")[0] not in {"0", "root"}
    assert dockerfile("STOPSIGNAL") == ["SIGTERM"]
    assert [json.loads(entry) for entry in dockerfile("ENTRYPOINT")] == [["jobrun", "worker"]]
    (install,) = dockerfile("RUN")
    assert "--no-cache-dir" in install
    assert "--mount=type=bind" in install, "no wheel stays in a layer"
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert str(pod["securityContext"]["runAsUser"]) == user.split(":")[0]


# --- Kubernetes -----------------------------------------------------------------------------


def test_the_kubernetes_manifests_validate_against_the_api_schema():
    validate = tool("kubernetes-validate", beside_python=True)
    files = sorted(str(path) for path in KUBERNETES.glob("*.yaml"))
    checked = run(validate, "--strict", "--quiet", *files)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert set(manifests()) == {"Deployment", "Job", "Secret"}


def test_the_migration_job_upgrades_with_the_deployments_image():
    (migrate,) = manifests()["Job"]["spec"]["template"]["spec"]["containers"]
    assert migrate["command"] == ["jobrun", "db", "upgrade"]
    assert migrate["image"] == worker_container()["image"]


def test_the_pods_drain_within_their_grace_period():
    pod = manifests()["Deployment"]["spec"]["template"]["spec"]
    timeouts = drain_timeouts()
    assert len(set(timeouts.values())) == 1, timeouts
    assert pod["terminationGracePeriodSeconds"] >= timeouts["Deployment"] + STOP_MARGIN_S
    container = worker_container()
    assert container["readinessProbe"]["exec"]["command"][:2] == ["jobrun", "health"]
    heartbeat_file = option(container["args"], "--heartbeat-file")
    assert heartbeat_file in container["livenessProbe"]["exec"]["command"][-1]
    assert heartbeat_file == option(json.loads(dockerfile("CMD")[0]), "--heartbeat-file")
    assert heartbeat_file in dockerfile("HEALTHCHECK")[0]


def liveness(path: Path) -> int:
    """The Deployment's liveness command, on ``path`` instead of the pod's file."""
    container = worker_container()
    command = list(container["livenessProbe"]["exec"]["command"])
    pod_path = option(container["args"], "--heartbeat-file")
    command[-1] = command[-1].replace(pod_path, str(path))
    return run(*command).returncode


def test_the_liveness_command_judges_the_heartbeat_by_its_age(tmp_path: Path):
    beat = tmp_path / "heartbeat"
    assert liveness(beat) != 0, "no heartbeat file: not alive"
    heartbeat.touch(beat)
    assert liveness(beat) == 0
    an_hour_ago = time.time() - 3600
    os.utime(beat, (an_hour_ago, an_hour_ago))
    assert liveness(beat) != 0, "a stale heartbeat: not alive"


async def test_the_heartbeat_is_touched_while_the_loop_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    beat = tmp_path / "heartbeat"
    heartbeat.first_beat(beat)
    long_ago = time.time() - 3600
    os.utime(beat, (long_ago, long_ago))
    monkeypatch.setattr(heartbeat, "HEARTBEAT_INTERVAL_S", 0.01)
    beating = asyncio.create_task(heartbeat.beat(beat))
    try:
        await eventually(lambda: beat.stat().st_mtime > long_ago + 60)
    finally:
        beating.cancel()


# --- the entry point, as a non-root user ----------------------------------------------------


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = check()
        if answer if isinstance(answer, bool) else await answer:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        # sleep: a poll interval; the deadline only bounds a hang
        await asyncio.sleep(0.05)


def as_nobody() -> list[str]:
    """``setpriv`` to user nobody. The venv's Python lives under /root here (mode 0700),
    so the user keeps the one capability to read and search directories; every write
    the worker makes (its database, the heartbeat) is still checked as nobody's."""
    if os.geteuid() != 0:
        message = "switching to another user needs root"
        if IN_CI:
            pytest.fail(f"under CI: {message}")
        pytest.skip(message)
    setpriv = tool("setpriv")
    return [
        setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
        "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
    ]  # fmt: skip


async def lease_held(engine: AsyncEngine, run_id: str) -> bool:
    async with engine.connect() as connection:
        query = select(job_runs.c.lease_owner).where(job_runs.c.id == run_id)
        return (await connection.execute(query)).scalar_one() is not None


def hand_to_nobody(home: Path) -> None:
    for path in (home, *home.iterdir()):
        os.chown(path, NOBODY, NOBODY)


def owner(path: Path) -> int:
    return path.stat().st_uid


def real_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    found = re.search(r"^Uid:\s+(\d+)\s", status, re.MULTILINE)
    assert found is not None, status
    return int(found.group(1))


def spawn_entrypoint(prefix: list[str], *arguments: str) -> subprocess.Popen[str]:
    """The Dockerfile's ENTRYPOINT (``jobrun`` being this venv's) with ``arguments``."""
    (entrypoint,) = [json.loads(entry) for entry in dockerfile("ENTRYPOINT")]
    assert entrypoint[0] == "jobrun"
    return subprocess.Popen(
        [*prefix, str(JOBRUN), *entrypoint[1:], *arguments],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_the_entrypoint_runs_as_nobody_and_drains_on_sigterm(sqlite_template: Path):
    prefix = as_nobody()
    home = Path(os.environ.get("TMPDIR", "/tmp")) / f"jobrun-deploy-{os.getpid()}"
    home.mkdir()
    try:
        await entrypoint_drains(prefix, home, sqlite_template)
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def entrypoint_drains(prefix: list[str], home: Path, template: Path) -> None:
    database = home / "worker.db"
    shutil.copyfile(template, database)
    url = f"sqlite+aiosqlite:///{database}"
    engine = create_async_engine(url)
    slow = await jobrun.start_job_run(
        jobrun.SqlJobRunStore(engine), module_id="demo", job="slow", payload={"sleep_s": 2}
    )
    await engine.dispose()
    hand_to_nobody(home)
    beat = home / "heartbeat"
    drain_s = drain_timeouts()["Dockerfile"]
    process = spawn_entrypoint(
        prefix, "--app", APP, "--url", url, "--interval", "0.2",
        "--drain-timeout", f"{drain_s:g}", "--heartbeat-file", str(beat),
    )  # fmt: skip
    engine = create_async_engine(url)
    try:
        await eventually(lambda: lease_held(engine, slow.id))
        assert real_uid(process.pid) == NOBODY
        assert owner(beat) == NOBODY
        assert liveness(beat) == 0
        process.send_signal(signal.SIGTERM)
        # Exit 0 means the pass finished inside the drain: at its end it is cancelled (1).
        _, stderr = await asyncio.to_thread(process.communicate, timeout=drain_s + 30)
        record = await jobrun.get_job_run(jobrun.SqlJobRunStore(engine), slow.id)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        await engine.dispose()
    assert process.returncode == 0, stderr
    assert "SIGTERM: stopping" in stderr
    assert "pass demo/slow[default] completed" in stderr
    assert record is not None
    assert record.status == "done"
    assert not beat.exists(), "the heartbeat file goes with the worker"
