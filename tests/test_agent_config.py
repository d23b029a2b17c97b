"""llmgw-agent --config FILE: the TOML file, its errors by key, flags over it, and a real
agent configured by a file whose labels, fabrics and GPUs reach a real server."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw import units
from llmgw.agent.config import AgentConfig, AgentTlsFiles, load_file
from llmgw.config import ConfigError, Seconds
from llmgw_cli.agent import build_parser, resolve
from tests.procs import fleet_server, kill_engines, running
from tests.test_agent_cli import run_agent
from tests.test_fleet_e2e import complete, control_config, model

FULL = """
server = "ctl.example.com:7443"
node_id = "gpu-1"
address = "10.0.0.5"
fabrics = ["ib-a", "ib-b"]
fake_gpus = "4x80GB:H100,2x24GB:L4"
state_dir = "/tmp/agent-state"
heartbeat = "2s"
max_backoff = "45s"
shutdown_grace = "1m"
log_level = "debug"
log_format = "json"

[labels]
rack = "r7"
zone = "eu-1"

[tls]
cert = "{cert}"
key = "{key}"
ca = "{ca}"
"""


def write(tmp_path: Path, text: str, name: str = "agent.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def pki(tmp_path: Path) -> dict[str, str]:
    """Files that exist where the TLS keys point (their content is not read here)."""
    files = {}
    for key in ("cert", "key", "ca"):
        (tmp_path / f"{key}.pem").write_text("-")
        files[key] = str(tmp_path / f"{key}.pem")
    return files


def test_every_key_of_a_full_file(tmp_path: Path) -> None:
    files = pki(tmp_path)
    config = load_file(write(tmp_path, FULL.format(**files)))
    assert config == AgentConfig(
        server="ctl.example.com:7443",
        node_id="gpu-1",
        address="10.0.0.5",
        labels={"rack": "r7", "zone": "eu-1"},
        fabrics=("ib-a", "ib-b"),
        fake_gpus="4x80GB:H100,2x24GB:L4",
        state_dir="/tmp/agent-state",
        heartbeat=units.parse_duration("2s"),
        max_backoff=units.parse_duration("45s"),
        shutdown_grace=units.parse_duration("1m"),
        log_level="debug",
        log_format="json",
        tls=AgentTlsFiles(cert=files["cert"], key=files["key"], ca=files["ca"]),
    )


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    config = load_file(write(tmp_path, ""))
    assert config == AgentConfig()
    assert (config.heartbeat, config.max_backoff, config.shutdown_grace) == (5.0, 30.0, 15.0)
    assert config.server is None and config.labels == {} and config.fabrics == ()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('sever = "h:1"', "sever: unknown key (did you mean 'server'?)"),
        ('[tls]\nsert = "c.pem"', "tls.sert: unknown key (did you mean 'cert'?)"),
        ('[lables]\nrack = "r1"', "lables: unknown key (did you mean 'labels'?)"),
        ('heartbeat = "soon"', "heartbeat: expected a duration such as '5s'"),
        ('heartbeat = "10ms"', "heartbeat: must be at least 0.05s, got 10ms"),
        ('max_backoff = "50ms"', "max_backoff: must be at least 0.1s, got 50ms"),
        ("[labels]\nrack = 7", "labels.rack: expected str, got 7"),
        ('fabrics = "ib-a"', "fabrics: must be an array, got a string"),
        ('fabrics = ["ib-a", 2]', "fabrics[1]: expected str, got 2"),
        ('labels = "rack=r7"', "labels: must be a table, got a string"),
        ('tls = "gpu-1.pem"', "tls: must be a table, got a string"),
        ('fabrics = ["ib-a", " "]', "fabrics: a fabric name must not be empty"),
        ('fake_gpus = "lots"', "fake_gpus: fake GPU spec 'lots': expected COUNTxMEMORY[:NAME]"),
        ('fake_gpus = "4x80GB:H100,many"', "fake_gpus: fake GPU spec 'many'"),
        ('server = "nohost"', "server: expected HOST:PORT or :PORT, got 'nohost'"),
        ('server = ":7443"', "server: a host is needed (e.g. 127.0.0.1:7443), got ':7443'"),
        ('node_id = " "', "node_id: must not be empty"),
        ('address = "gpu-1.lan"', "address: 'gpu-1.lan' does not appear to be an IPv4 or IPv6"),
        ('log_level = "loud"', "log_level: must be one of debug, info, warning, error"),
        ('log_format = "xml"', "log_format: must be one of text, json"),
        ('[tls]\ncert = "/nonexistent/c.pem"', "tls.cert: no such file: /nonexistent/c.pem"),
        ("server = 7443", "server: expected str, got 7443"),
    ],
)
def test_file_problems_name_the_key(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    (only,) = caught.value.problems
    assert only.startswith(f"config file {path}: {problem}"), only


def test_every_problem_of_a_file_is_named_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, 'heartbeat = "10ms"\nlog_level = "loud"\nnode_id = ""\n')
    with pytest.raises(ConfigError) as caught:
        load_file(path)
    assert [
        p.removeprefix(f"config file {path}: ").split(":")[0] for p in caught.value.problems
    ] == [
        "node_id",
        "heartbeat",
        "log_level",
    ]


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_file(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_file(write(tmp_path, "server = "))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('sever = "127.0.0.1:7443"', "sever: unknown key (did you mean 'server'?)"),
        ("server = ", "invalid TOML"),
        # Several problems still make one line.
        ('heartbeat = "10ms"\nfake_gpus = "lots"', "fake_gpus: fake GPU spec 'lots'"),
    ],
)
def test_a_bad_file_is_one_line_and_exit_2(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    done = run_agent("--config", str(path), "--server", "127.0.0.1:1")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"llmgw-agent: error: config file {path}: "), line
    assert message in line
    if "heartbeat" in text:
        assert f"; config file {path}: heartbeat: must be at least 0.05s, got 10ms" in line


def test_a_missing_config_file_is_exit_2(tmp_path: Path) -> None:
    done = run_agent("--config", str(tmp_path / "nope.toml"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"llmgw-agent: error: config file {tmp_path / 'nope.toml'}: not found"
    )


# -- flags over the file -------------------------------------------------------------------


def resolved(*argv: str) -> AgentConfig:
    return resolve(build_parser().parse_args(argv))


def test_flags_override_the_file_and_labels_merge_key_by_key(tmp_path: Path) -> None:
    files = pki(tmp_path)
    path = write(tmp_path, FULL.format(**files))
    config = resolved(
        "--config", str(path),
        "--server", "127.0.0.1:9443",
        "--label", "zone=eu-2",
        "--label", "pool=batch",
        "--fabric", "roce-1",
        "--heartbeat", "250ms",
        "--tls-ca", files["cert"],
    )  # fmt: skip
    assert config.server == "127.0.0.1:9443"
    assert config.labels == {"rack": "r7", "zone": "eu-2", "pool": "batch"}
    assert config.fabrics == ("roce-1",)  # arrays replace
    assert config.heartbeat == 0.25
    assert config.tls == AgentTlsFiles(cert=files["cert"], key=files["key"], ca=files["cert"])
    # What no flag set comes from the file.
    assert (config.node_id, config.address, config.fake_gpus) == (
        "gpu-1",
        "10.0.0.5",
        "4x80GB:H100,2x24GB:L4",
    )
    assert (config.max_backoff, config.shutdown_grace, config.log_level) == (45.0, 60.0, "debug")


def test_without_a_file_flags_and_defaults(tmp_path: Path) -> None:
    config = resolved("--server", "h:1", "--fabric", "a", "--fabric", " a ", "--fabric", "b")
    assert config == AgentConfig(server="h:1", fabrics=("a", "b"))
    files = pki(tmp_path)
    every = resolved(
        "--server", "h:1", "--node-id", "n", "--address", "::1", "--label", "k=v",
        "--fabric", "f", "--fake-gpus", "2x24GB:L4", "--state-dir", str(tmp_path),
        "--heartbeat", "1s", "--max-backoff", "2s", "--shutdown-grace", "3s",
        "--log-level", "warning", "--log-format", "json",
        "--tls-cert", files["cert"], "--tls-key", files["key"],
        "--tls-ca", files["ca"],
    )  # fmt: skip
    assert every == AgentConfig(
        server="h:1",
        node_id="n",
        address="::1",
        labels={"k": "v"},
        fabrics=("f",),
        fake_gpus="2x24GB:L4",
        state_dir=str(tmp_path),
        heartbeat=Seconds(1.0),
        max_backoff=Seconds(2.0),
        shutdown_grace=Seconds(3.0),
        log_level="warning",
        log_format="json",
        tls=AgentTlsFiles(cert=files["cert"], key=files["key"], ca=files["ca"]),
    )


def test_the_server_may_come_from_the_file_alone(tmp_path: Path) -> None:
    config = resolved("--config", str(write(tmp_path, 'server = "h:7443"')))
    assert config.server == "h:7443"
    with pytest.raises(ConfigError, match=r"required: --server \(or server in the --config file"):
        resolved("--config", str(write(tmp_path, 'node_id = "n"', "other.toml")))


def test_a_flags_problem_names_the_flag_and_a_files_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'server = "h:1"\naddress = "10.0.0.5"\n')
    with pytest.raises(ConfigError) as caught:
        resolved("--config", str(path), "--address", "gpu-1.lan")
    assert caught.value.problems == (
        "--address: 'gpu-1.lan' does not appear to be an IPv4 or IPv6 address",
    )
    # The flag's good value does not excuse the file's bad one: the file is wrong.
    bad = write(tmp_path, 'server = "h:1"\naddress = "gpu-1.lan"\n', "bad.toml")
    with pytest.raises(ConfigError, match=r"config file .*bad\.toml: address: 'gpu-1\.lan'"):
        resolved("--config", str(bad), "--address", "10.0.0.6")


def test_tls_cert_and_key_may_come_from_file_and_flag_but_not_alone(tmp_path: Path) -> None:
    files = pki(tmp_path)
    path = write(tmp_path, f'server = "h:1"\n[tls]\ncert = "{files["cert"]}"\n')
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key go together"):
        resolved("--config", str(path))
    config = resolved("--config", str(path), "--tls-key", files["key"])
    assert config.tls == AgentTlsFiles(cert=files["cert"], key=files["key"])


# -- end to end: a file-configured agent and a real server ----------------------------------


def test_labels_fabrics_and_gpus_from_a_config_file_reach_the_server(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with fleet_server(control_config([model("m")])) as srv:
        path = write(
            tmp_path,
            f"""
server = "{srv.agent_address}"
node_id = "from-file"
address = "127.0.0.71"
fake_gpus = "2x80GB:H100,1x24GB:L4"
state_dir = "{state}"
heartbeat = "200ms"
max_backoff = "1s"
shutdown_grace = "5s"
fabrics = ["ib-a", "ib-b"]

[labels]
rack = "r7"
zone = "eu-1"
""",
        )
        try:
            # Only the file, and one flag over it.
            with running("llmgw-agent", "--config", str(path), "--label", "zone=eu-2") as proc:
                node = srv.wait(
                    lambda: srv.nodes().get("from-file"), "from-file registered", logs=[proc]
                )
                assert node["labels"] == {"rack": "r7", "zone": "eu-2"}
                assert node["fabrics"] == ["ib-a", "ib-b"]
                assert node["address"] == "127.0.0.71"
                assert [(g["index"], g["name"], g["memory_total_bytes"]) for g in node["gpus"]] == [
                    (0, "H100", 80 * 10**9),
                    (1, "H100", 80 * 10**9),
                    (2, "L4", 24 * 10**9),
                ]
                # The file's state_dir is where the agent keeps its engines' records, and
                # the node serves.
                srv.wait(lambda: srv.ready_replicas("m", 1), "m ready", logs=[proc])
                assert list((state / "run").glob("*.json"))
                complete(srv)
        finally:
            kill_engines(state)
