"""The shipped ways to run the image, checked against the programs they run: the
Containerfile's defaults, deploy/compose/ (server, agent and simulator) and
deploy/kubernetes/ (the server's ConfigMap, Deployment and Service; the agents'
DaemonSet). Every command line is parsed by its program's own argument parser (and the
agent's resolved into its settings), every configuration loads through llmgw's
configuration loader with the LLMGW_ variables set beside it, and the ports, probes,
service names, mounts and user agree with them.

Neither compose nor Kubernetes runs here: tests/test_image.py builds and runs the image
itself with podman; this is the structure around it.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from llmgw import config as cfg
from llmgw import units
from llmgw.agent.config import servers
from llmgw_cli import agent as agent_cli
from llmgw_cli import ctl as ctl_cli
from llmgw_cli import server as server_cli
from llmgw_cli import sim as sim_cli

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PARSERS = {
    "llmgw-server": server_cli.build_parser,
    "llmgw-agent": agent_cli.build_parser,
    "llmgw-sim": sim_cli.build_parser,
    "llmgw-ctl": ctl_cli.build_parser,
}


def _containerfile() -> dict[str, list[str]]:
    """The final stage's instructions (continuation lines joined), by keyword."""
    text = (ROOT / "Containerfile").read_text().replace("\\\n", " ")
    final = text.split("\nFROM ${BASE}\n")[-1]
    found: dict[str, list[str]] = {}
    for line in final.splitlines():
        if line.strip() and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.setdefault(keyword, []).append(" ".join(rest.split()))
    return found


STAGE = _containerfile()
#: The final stage's instructions given once (a list for COPY and RUN).
IMAGE = {keyword: lines[0] for keyword, lines in STAGE.items() if len(lines) == 1}
#: The image's user (numeric, so Kubernetes' runAsNonRoot can check it).
UID, GID = (int(part) for part in IMAGE["USER"].split(":"))


def _parse(program: str, argv: list[str]) -> Any:
    """`argv` as `program` parses it; a rejected one fails the test with argparse's word."""
    try:
        return PARSERS[program]().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{program} {shlex.join(argv)}: rejected by its parser (exit {exc.code})")


def _port(address: str) -> int:
    return units.parse_address(address).port


def _load(toml: str, environ: Mapping[str, str], files: Mapping[str, Path]) -> cfg.Config:
    """The server's configuration as llmgw-server loads it; paths under each key of
    `files` (a mount in the container) are looked up in its value instead."""
    for mount, local in files.items():
        toml = toml.replace(mount, str(local))
    return cfg.load(data=tomllib.loads(toml), environ=environ)


def test_the_images_defaults_run_the_server_on_its_shipped_configuration() -> None:
    assert IMAGE["ENTRYPOINT"] == '["llmgw-server"]'
    command = yaml.safe_load(IMAGE["CMD"])
    args = _parse("llmgw-server", command)
    # The default configuration is the file the image copies to where CMD reads it.
    (copied,) = (c for c in STAGE["COPY"] if c.endswith(f" {args.config}"))
    source = ROOT / copied.split()[0]
    config = cfg.load(source, environ={})
    exposed = {int(port) for port in IMAGE["EXPOSE"].split()}
    assert exposed == {_port(config.listen), _port(config.admin_listen), 7443}
    assert f"127.0.0.1:{_port(config.listen)}/health" in IMAGE["ENV"]
    # The store in the user's home, which the image creates for it.
    assert config.store.url == "sqlite:///var/lib/llmgw/llmgw.db"
    (useradd,) = (r for r in STAGE["RUN"] if r.startswith("useradd "))
    assert f"--uid {UID} " in useradd and "--home-dir /var/lib/llmgw" in useradd
    assert IMAGE["WORKDIR"] == "/var/lib/llmgw"


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text()))


def _argv(service: Mapping[str, Any]) -> tuple[str, list[str]]:
    entrypoint = service.get("entrypoint", yaml.safe_load(IMAGE["ENTRYPOINT"]))
    (program,) = entrypoint
    return program, [str(a) for a in service["command"]]


def test_the_compose_demo_wires_server_agent_and_simulator() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"server", "agent", "sim"}
    assert len({s["image"] for s in services.values()}) == 1

    program, argv = _argv(services["server"])
    assert program == "llmgw-server"
    args = _parse(program, argv)
    mounts = dict(v.rsplit(":", 2)[:2] for v in services["server"]["volumes"] if ":ro" in v)
    local = DEPLOY / "compose" / next(k for k, v in mounts.items() if v == args.config)
    environ = {k: str(v) for k, v in services["server"]["environment"].items()}
    config = cfg.load(local, environ=environ)
    assert services["server"]["ports"] == [f"{_port(config.listen)}:{_port(config.listen)}"]
    # The server's store on the named volume, in the directory the image gives its user.
    assert "llmgw-state:/var/lib/llmgw" in services["server"]["volumes"]
    assert set(compose["volumes"]) == {"llmgw-state"}

    program, argv = _argv(services["agent"])
    assert program == "llmgw-agent"
    agent = agent_cli.resolve(_parse(program, argv))
    (server,) = servers(str(agent.server))
    host, _, port = server.rpartition(":")
    assert (host, int(port)) == ("server", _port(config.agent_listen))
    assert config.allow_insecure_agents  # plaintext agents off loopback, said in the file
    assert agent.fake_gpus
    # What the control plane places on the agent is a simulated engine, which the
    # image has.
    assert [p.engine for m in config.models for p in m.profiles] == ["sim"]

    program, argv = _argv(services["sim"])
    assert program == "llmgw-sim"
    sim = _parse(program, argv)
    (endpoint,) = config.endpoints
    url = urlsplit(endpoint.url)
    assert (url.hostname, url.port) == ("sim", sim.port)
    assert sim.host == "0.0.0.0"
    assert list(endpoint.models) == sim.models
    # The image's HEALTHCHECK looks at the server's /health: the simulator's own
    # instead, and none for the agent, which serves no HTTP.
    assert services["sim"]["environment"]["HEALTHCHECK_URL"].endswith(f":{sim.port}/health")
    assert services["agent"]["healthcheck"] == {"disable": True}


def _kube(name: str) -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text())
    return {doc["kind"]: doc for doc in docs}


def _pod_checks(workload: Mapping[str, Any]) -> dict[str, Any]:
    """What every workload must have; returns its one container."""
    spec = workload["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (
        UID,
        GID,
    )
    (container,) = pod["containers"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in container["volumeMounts"]} == volumes
    return dict(container)


def _mount(container: Mapping[str, Any], name: str) -> str:
    return str(next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == name))


def _stand_in_files(tmp_path: Path, names: list[str]) -> Path:
    for name in names:
        (tmp_path / name).write_text("stands in for a mounted file\n")
    return tmp_path


def test_the_kubernetes_server_runs_its_configmap_behind_its_service(tmp_path: Path) -> None:
    kinds = _kube("server.yaml")
    assert set(kinds) == {"ConfigMap", "Deployment", "Service"}
    assert kinds["Deployment"]["apiVersion"] == "apps/v1"
    container = _pod_checks(kinds["Deployment"])
    assert container["name"] == "llmgw-server"
    assert "command" not in container  # the image's entrypoint: llmgw-server
    args = _parse("llmgw-server", container["args"])
    pod = kinds["Deployment"]["spec"]["template"]["spec"]

    # The ConfigMap, mounted where --config reads it, loads with the pod's variables.
    (mount,) = (m for m in container["volumeMounts"] if m["mountPath"] == args.config)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == kinds["ConfigMap"]["metadata"]["name"]
    toml = kinds["ConfigMap"]["data"][mount["subPath"]]
    environ = {e["name"]: e["value"] for e in container["env"]}
    tls = _mount(container, "agent-tls")
    secret = next(v for v in pod["volumes"] if v["name"] == "agent-tls")["secret"]
    assert secret["secretName"] == "llmgw-agent-tls"
    stand_in = _stand_in_files(tmp_path, ["server.pem", "server.key", "ca.pem"])
    config = _load(toml, environ, {tls: stand_in})
    assert config.agent_tls is not None  # agents off loopback: mutual TLS
    assert config.workers == int(environ["LLMGW_WORKERS"])
    # The store on the writable volume; the root filesystem is read-only.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert config.store.url == f"sqlite://{_mount(container, 'state')}/llmgw.db"

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": _port(config.listen), "agents": _port(config.agent_listen)}
    ready = container["readinessProbe"]["httpGet"]
    assert (ready["path"], ports[ready["port"]]) == ("/health", _port(config.listen))
    # Liveness from inside the pod: the admin listener's /healthz on its loopback.
    probe = " ".join(container["livenessProbe"]["exec"]["command"])
    assert f"http://127.0.0.1:{_port(config.admin_listen)}/healthz" in probe
    assert units.parse_address(config.admin_listen).host == "127.0.0.1"

    service = kinds["Service"]["spec"]
    labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert {p["name"]: p["targetPort"] for p in service["ports"]} == {n: n for n in ports}


def test_the_kubernetes_agents_dial_the_servers_service(tmp_path: Path) -> None:
    kinds = _kube("agent.yaml")
    assert set(kinds) == {"DaemonSet"}
    assert kinds["DaemonSet"]["apiVersion"] == "apps/v1"
    container = _pod_checks(kinds["DaemonSet"])
    assert container["command"] == ["llmgw-agent"]
    pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
    # Engines listen on the node's address, where the server reaches them.
    assert pod["hostNetwork"] is True

    # $(VAR) is Kubernetes' expansion of the container's variables; each one used is
    # defined, from the pod's node.
    env = {e["name"]: e for e in container["env"]}
    used = {m for a in container["args"] for m in re.findall(r"\$\((\w+)\)", a)}
    assert used == {"NODE_NAME", "NODE_IP"}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NODE_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    node = {"NODE_NAME": "gpu-1", "NODE_IP": "192.0.2.10"}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: node[m.group(1)], a) for a in container["args"]]
    pki = _mount(container, "pki")
    stand_in = _stand_in_files(tmp_path, ["gpu-1.pem", "gpu-1.key", "ca.pem"])
    argv = [a.replace(pki, str(stand_in)) for a in argv]
    agent = agent_cli.resolve(_parse("llmgw-agent", argv))
    assert (agent.node_id, agent.address) == ("gpu-1", "192.0.2.10")
    assert agent.tls.cert == str(stand_in / "gpu-1.pem")  # its certificate names the node
    assert str(agent.state_dir).startswith(_mount(container, "state"))

    # The server's Service, by its cluster name, on the agents' port.
    server = _kube("server.yaml")["Service"]
    (address,) = servers(str(agent.server))
    host, _, port = address.rpartition(":")
    assert host.split(".")[0] == server["metadata"]["name"]
    assert int(port) == next(p["port"] for p in server["spec"]["ports"] if p["name"] == "agents")
