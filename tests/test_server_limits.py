"""What llmgw-server derives from its host: the connection budget from the open-file limit,
and whether the admin listener is on loopback (and so needs no admin key)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llmgw.assembly import _all_loopback
from llmgw.http.budget import ADMIN_MAX_CONNECTIONS, FD_RESERVE
from llmgw.router.listener import connection_cap

# A child process, so that the limits it sets are its own.
_CAP = """
import json, resource, sys
from llmgw.http.budget import connection_budget
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
budget = connection_budget(int(sys.argv[3]))
print(json.dumps([budget.client, budget.admin, resource.getrlimit(resource.RLIMIT_NOFILE)[0]]))
"""


def budget_in_child(soft: int, hard: int, configured: int = 0) -> tuple[int, int, int]:
    """The client and admin shares, and the soft limit after, in a process started with
    these limits."""
    out = subprocess.run(
        [sys.executable, "-c", _CAP, str(soft), str(hard), str(configured)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    client, admin, soft_after = json.loads(out)
    return client, admin, soft_after


def test_the_budget_raises_the_soft_file_limit_to_the_hard_one_and_shares_what_is_left() -> None:
    # systemd's default: soft 1024 under a far higher hard limit
    client, admin, soft = budget_in_child(1024, 4096)
    assert soft == 4096
    left = 4096 - FD_RESERVE
    assert admin == left // 16
    # A proxied request holds two descriptors: the client's and the engine's.
    assert client == (left - admin) // 2
    assert 2 * client + admin <= left


def test_the_admin_share_is_bounded() -> None:
    client, admin, _ = budget_in_child(8192, 8192)
    assert admin == ADMIN_MAX_CONNECTIONS
    assert client == (8192 - FD_RESERVE - ADMIN_MAX_CONNECTIONS) // 2


def test_the_budget_under_a_low_hard_limit_keeps_the_reserve_and_a_floor() -> None:
    left = 512 - FD_RESERVE
    assert budget_in_child(512, 512) == ((left - left // 16) // 2, left // 16, 512)
    assert budget_in_child(100, 100) == (16, 16, 100)  # less than the reserve: still serve a few


def test_a_configured_cap_is_taken_as_it_is_and_leaves_the_limit_alone() -> None:
    assert budget_in_child(1024, 4096, configured=300) == (300, (1024 - FD_RESERVE) // 16, 1024)
    assert connection_cap(7) == 7


@pytest.mark.parametrize(
    ("addresses", "loopback"),
    [
        (["127.0.0.1:9000"], True),
        (["127.45.0.9:9000"], True),  # all of 127/8 is loopback
        (["[::1]:9000"], True),
        (["127.0.0.1:9000", "[::1]:9000"], True),
        (["0.0.0.0:9000"], False),
        (["[::]:9000"], False),
        (["127.0.0.1:9000", "10.0.0.1:9000"], False),  # one listener off loopback is enough
        (["128.0.0.1:9000"], False),
        (["[::ffff:10.0.0.1]:9000"], False),
    ],
)
def test_the_admin_listener_is_on_loopback_only_when_every_bound_address_is(
    addresses: list[str], loopback: bool
) -> None:
    assert _all_loopback(addresses) is loopback
