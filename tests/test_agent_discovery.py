"""GPU discovery: nvidia-smi output (files in nvidia-smi's csv,noheader,nounits format),
the fallback without utilisation, and the fake and CPU-only paths."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from llmgw.agent.discovery import (
    QUERY_FIELDS,
    DiscoveryError,
    discover,
    fake_gpus,
    nvidia_smi_argv,
    parse_nvidia_smi,
)

DATA = Path(__file__).parent / "data" / "nvidia-smi"
MIB = 1024 * 1024


def test_query_asks_for_utilisation_last() -> None:
    argv = nvidia_smi_argv()
    assert argv[0] == "nvidia-smi"
    assert argv[1] == (
        "--query-gpu=index,uuid,name,memory.total,memory.used,"
        "ecc.errors.uncorrected.volatile.total,utilization.gpu"
    )
    assert argv[2] == "--format=csv,noheader,nounits"
    assert QUERY_FIELDS[-1] == "utilization.gpu"


def test_eight_h100s() -> None:
    gpus = parse_nvidia_smi((DATA / "h100-8x.csv").read_text())
    assert [g.index for g in gpus] == list(range(8))
    first = gpus[0]
    assert first.uuid == "GPU-5a2b6c1e-7f3d-4e0a-9b8c-1d2e3f4a5b60"
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert first.memory_total == 81559 * MIB
    assert first.memory_used == 78012 * MIB
    assert first.utilization == pytest.approx(0.97)
    assert first.ecc_errors == 0
    assert gpus[4].ecc_errors == 2
    assert gpus[2].utilization == 0.0  # a reported zero stays a zero
    assert gpus[7].utilization == 1.0
    assert len({g.uuid for g in gpus}) == 8


def test_na_and_not_supported_are_absent_not_zero() -> None:
    rtx, l4, t4 = parse_nvidia_smi((DATA / "mixed-na.csv").read_text())
    assert rtx.name == "NVIDIA GeForce RTX 4090"
    assert rtx.ecc_errors is None  # [N/A]: consumer cards have no ECC
    assert rtx.utilization == pytest.approx(0.37)
    assert rtx.memory_used == 1523 * MIB
    assert l4.memory_used is None
    assert l4.ecc_errors is None  # [Not Supported]
    assert l4.utilization is None
    assert l4.memory_total == 23034 * MIB
    assert t4.name == "Tesla T4"
    assert t4.utilization is None  # empty field
    assert t4.ecc_errors == 0


def test_older_driver_row_without_utilisation_parses() -> None:
    a, b = parse_nvidia_smi((DATA / "old-driver-no-utilization.csv").read_text())
    assert a.memory_total == 81920 * MIB
    assert a.memory_used == 4 * MIB
    assert a.ecc_errors == 0
    assert a.utilization is None
    assert b.ecc_errors is None
    assert b.utilization is None


def test_garbage_rows_are_skipped_not_fatal() -> None:
    text = (
        "No devices were found\n"
        "\n"
        "0, GPU-x, NVIDIA A10, 23028, 10, 0, 5\n"
        "x, GPU-y, broken\n"
        "1, GPU-z\n"
    )
    gpus = parse_nvidia_smi(text)
    assert [(g.index, g.uuid) for g in gpus] == [(0, "GPU-x")]


def _fake_smi(tmp_path: Path, body: str) -> str:
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def test_discover_runs_nvidia_smi(tmp_path: Path) -> None:
    recorded = DATA / "h100-8x.csv"
    smi = _fake_smi(tmp_path, f'echo "$@" > {tmp_path}/args\ncat {recorded}\n')
    gpus = await discover(None, nvidia_smi=smi)
    assert len(gpus) == 8
    assert (tmp_path / "args").read_text().split() == nvidia_smi_argv()[1:]


async def test_discover_retries_without_utilisation_when_the_driver_rejects_it(
    tmp_path: Path,
) -> None:
    recorded = DATA / "old-driver-no-utilization.csv"
    smi = _fake_smi(
        tmp_path,
        'case "$1" in *utilization.gpu*) '
        "echo 'Field \"utilization.gpu\" is not a valid field to query.'; exit 2;; esac\n"
        f"cat {recorded}\n",
    )
    gpus = await discover(None, nvidia_smi=smi)
    assert [g.utilization for g in gpus] == [None, None]


async def test_discover_failure_is_an_error_with_nvidia_smis_words(tmp_path: Path) -> None:
    smi = _fake_smi(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\n'
        "exit 9\n",
    )
    with pytest.raises(DiscoveryError, match="code 9: NVIDIA-SMI has failed"):
        await discover(None, nvidia_smi=smi)


async def test_discover_hanging_nvidia_smi_times_out(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, "exec sleep 30\n")
    with pytest.raises(DiscoveryError, match="did not answer"):
        await discover(None, nvidia_smi=smi, time_limit=0.3)


async def test_fake_gpus_and_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = await discover("2x40GB:A100", node_id="n1")
    assert [(g.index, g.name, g.uuid) for g in gpus] == [
        (0, "A100", "GPU-fake-n1-0"),
        (1, "A100", "GPU-fake-n1-1"),
    ]
    monkeypatch.setenv("PATH", "/nonexistent")
    assert await discover(None) == ()


def test_fake_gpus_in_several_named_groups() -> None:
    gpus = fake_gpus("4x80GB:H100,2x24GB:L4", node_id="n7")
    # One run of indices across the groups, in the order written.
    assert [(g.index, g.name, g.memory_total) for g in gpus] == [
        *((i, "H100", 80 * 10**9) for i in range(4)),
        (4, "L4", 24 * 10**9),
        (5, "L4", 24 * 10**9),
    ]
    assert [g.uuid for g in gpus] == [f"GPU-fake-n7-{i}" for i in range(6)]
    assert all(g.memory_used == 0 for g in gpus)
    # Not reported by anything: absent, not zero.
    assert all(g.utilization is None and g.ecc_errors is None for g in gpus)


def test_fake_gpu_groups_count_memory_and_name_are_each_optional() -> None:
    gpus = fake_gpus(" 80GB , 2 x 40GiB:A100-40GB ,1x24GB")
    assert [(g.index, g.name, g.memory_total) for g in gpus] == [
        (0, "Fake-80GB", 80 * 10**9),
        (1, "A100-40GB", 40 * 2**30),
        (2, "A100-40GB", 40 * 2**30),
        (3, "Fake-24GB", 24 * 10**9),
    ]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("4x80GB:H100,lots", "'lots': expected COUNTxMEMORY[:NAME]"),
        ("4x80GB,,2x24GB", "'': expected COUNTxMEMORY[:NAME]"),
        ("4x80GB,2xGB:L4", "'2xGB:L4': unknown size unit 'xgb'"),
    ],
)
def test_a_bad_fake_gpu_group_is_named(spec: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        fake_gpus(spec)
    assert str(caught.value).startswith(f"fake GPU spec {problem}")
