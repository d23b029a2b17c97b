"""llmgw's image, built and run with Debian's podman: `make image` (the Containerfile on
the base scripts/image_base.sh makes with debootstrap, built once per machine), then
llmgw-server in a container of it, configured by a mounted file and LLMGW_ variables,
serving a chat completion from an llmgw-sim on the host (the container shares the
host's network: loopback only), its HEALTHCHECK, a graceful stop, and the image's
other programs, user and settings (docs/operations.md, "Container image").

Podman runs here with a containers.conf of the test's own (:func:`_containers_conf`):
on this suite's machines (a cgroup v1/v2 hybrid, no CAP_SYS_RESOURCE) crun refuses to
start a container and podman's default rlimits cannot be set. scripts/test_deps.sh
installs podman, runc and debootstrap; without them this test fails saying so.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw import __version__
from llmgw.testing.procs import reserve_port

from .procs import sim
from .waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent
TAG = "localhost/llmgw:test"
# The base (debootstrap, first time on a machine: 1.5-3 minutes) and the image (pip
# fetching the dependencies: about 1.5 minutes).
BUILD_TIMEOUT = 900.0
CONTAINER_UID = 10001


def _containers_conf(folder: Path) -> Path:
    """podman's settings for this machine: runc (crun refuses a cgroup v1/v2 hybrid),
    and rlimits it can set without CAP_SYS_RESOURCE (its defaults, 1048576 open files
    and processes, are above the hard limits here: nofile this process's hard limit,
    nproc below the 32768 podman itself runs with)."""

    def hard(limit: int, most: int) -> int:
        value = resource.getrlimit(limit)[1]
        return most if value == resource.RLIM_INFINITY else min(value, most)

    nofile = hard(resource.RLIMIT_NOFILE, 1048576)
    nproc = hard(resource.RLIMIT_NPROC, 4096)
    runtime = '[engine]\nruntime = "runc"\n' if shutil.which("runc") else ""
    conf = folder / "containers.conf"
    conf.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        f"{runtime}"
    )
    return conf


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    missing = [tool for tool in ("podman", "runc", "debootstrap") if not shutil.which(tool)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed (scripts/test_deps.sh installs them as "
            f"root: apt-get install {' '.join(missing)})"
        )
    conf = _containers_conf(tmp_path_factory.mktemp("podman"))
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _run(argv: list[str], env: dict[str, str], timeout: float = 120.0) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(argv)} exited {done.returncode}:\n{out[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def image(podman_env: dict[str, str]) -> str:
    """`make image` as the docs say, tagged TAG; the base is kept between runs."""
    _run(["make", "-C", str(ROOT), "image", f"IMAGE={TAG}"], podman_env, BUILD_TIMEOUT)
    return TAG


def _podman(env: dict[str, str], *args: str, timeout: float = 120.0) -> str:
    return _run(["podman", *args], env, timeout)


def test_the_image_runs_its_programs_as_its_own_user(
    image: str, podman_env: dict[str, str]
) -> None:
    run = ["run", "--rm", "--network=none", "--health-interval=disable"]
    assert _podman(podman_env, *run, image, "--version") == f"llmgw-server {__version__}\n"
    for program in ("llmgw-agent", "llmgw-sim", "llmgw-ctl"):
        out = _podman(podman_env, *run, "--entrypoint", program, image, "--version")
        assert out == f"{program} {__version__}\n"
    ids = _podman(podman_env, *run, "--entrypoint", "id", image, "-u")
    assert ids == f"{CONTAINER_UID}\n"
    # The extras the image promises (server, postgres, ctl), and not the others.
    probe = "import llmgw.extras as e; print([x for x in e.EXTRAS if e.missing(x)])"
    out = _podman(podman_env, *run, "--entrypoint", "python3", image, "-c", probe)
    assert out == "['profiling', 'tracing']\n"

    (info,) = json.loads(_podman(podman_env, "image", "inspect", image))
    config = info["Config"]
    assert config["User"] == f"{CONTAINER_UID}:{CONTAINER_UID}"
    assert config["Entrypoint"] == ["llmgw-server"]
    assert config["Cmd"] == ["--config", "/etc/llmgw/llmgw.toml"]
    assert set(config["ExposedPorts"]) == {"8080/tcp", "9090/tcp", "7443/tcp"}
    assert info["Healthcheck"]["Test"][:2] == ["CMD", "python3"]


@pytest.fixture
def container(podman_env: dict[str, str]) -> Iterator[str]:
    name = f"llmgw-test-{uuid.uuid4().hex[:8]}"
    yield name
    subprocess.run(
        ["podman", "rm", "--force", "--time", "0", name],
        capture_output=True,
        timeout=60,
        check=False,
        env=podman_env,
    )


def test_the_server_in_the_image_serves_an_engine_on_the_host(
    image: str, podman_env: dict[str, str], container: str, tmp_path: Path
) -> None:
    chat = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hello from the host"}],
        "max_tokens": 5,
        "seed": 7,
    }
    with sim() as (engine, engine_url), reserve_port() as port:
        # The configuration as an operator mounts it; LLMGW_ variables on top of it.
        config = tmp_path / "llmgw.toml"
        config.write_text(
            'admin_listen = "127.0.0.1:0"\n'
            "[store]\n"
            'url = "sqlite:///var/lib/llmgw/llmgw.db"\n'
            "[[endpoints]]\n"
            'id = "host-sim"\n'
            f'url = "{engine_url}"\n'
            'models = ["sim-model"]\n'
        )
        config.chmod(0o644)
        url = f"http://127.0.0.1:{port}"
        _podman(
            podman_env,
            "run",
            "--detach",
            "--name",
            container,
            "--network=host",
            # No systemd here to run the timer: the check is run below by hand.
            "--health-interval=disable",
            "--volume",
            f"{config}:/etc/llmgw/llmgw.toml:ro",
            "--env",
            f"LLMGW_LISTEN=127.0.0.1:{port}",
            "--env",
            "LLMGW_WORKERS=1",
            "--env",
            f"HEALTHCHECK_URL={url}/health",
            image,
        )

        def logs() -> str:
            done = subprocess.run(
                ["podman", "logs", container],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env=podman_env,
            )
            return f"container output:\n{done.stdout}{done.stderr}"

        def healthy() -> bool | None:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200 or None

        wait_for(healthy, "the containerized server's /health", 60, context=logs)
        reply = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=30)
        assert reply.status_code == 200, reply.text
        direct = httpx.post(f"{engine_url}/v1/chat/completions", json=chat, timeout=30)
        answer = reply.json()
        # The engine's own answer to the same seeded request, through the gateway.
        assert answer["choices"][0]["message"] == direct.json()["choices"][0]["message"]
        assert answer["usage"]["completion_tokens"] == 5
        assert reply.headers["x-request-id"]

        # The image's HEALTHCHECK, as podman runs it (in the container, as its user).
        assert _podman(podman_env, "healthcheck", "run", container) == ""
        state = json.loads(_podman(podman_env, "inspect", container))[0]["State"]
        assert state["Health"]["Status"] == "healthy"

        # podman stop: SIGTERM, a graceful drain, exit status 0.
        _podman(podman_env, "stop", "--time", "30", container, timeout=60)
        state = json.loads(_podman(podman_env, "inspect", container))[0]["State"]
        assert state["ExitCode"] == 0, logs()
        assert engine.popen.poll() is None
