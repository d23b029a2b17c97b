"""Certificates for the agent port's mutual TLS, made with the ``openssl`` command.

For tests, demos and small fleets: a CA, the server's certificate (with the host
names and addresses agents dial as subject alternative names) and one client
certificate per node whose common name is the node id (the identity the server
checks registrations against, DESIGN §7). ``scripts/make_certs.sh`` runs the same
openssl commands by hand; a real fleet may use any PKI that issues the same shapes.

    python -m llmgw.transport.certs DIR --host localhost --host 127.0.0.1 gpu-1 gpu-2

writes ``DIR/ca.pem``, ``ca.key``, ``server.pem``, ``server.key``, ``gpu-1.pem``,
``gpu-1.key``, ... Keys are EC P-256, readable by their owner only. Run again with
more node ids to add nodes: an existing CA is reused, and so is the server's
certificate unless ``--host`` is given.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

__all__ = ["CertError", "CertPair", "make_ca", "make_node_cert", "make_server_cert"]

DAYS_CA = 3650
DAYS_LEAF = 825


class CertError(RuntimeError):
    """openssl is missing or refused to make a certificate."""


@attrs.frozen
class CertPair:
    cert: Path  # PEM certificate
    key: Path  # PEM private key (unencrypted)


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise CertError("openssl is not installed (apt-get install openssl)")
    done = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CertError(f"openssl {args[0]} failed: {done.stderr.strip()}")


def _key_args(key: Path) -> list[str]:
    return [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
    ]


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def make_ca(
    directory: Path | str, name: str = "ca", *, subject: str = "llmgw agent CA"
) -> CertPair:
    """A self-signed CA: ``name.pem`` and ``name.key`` in `directory`."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    pair = CertPair(out / f"{name}.pem", out / f"{name}.key")
    _openssl(
        "req", "-x509", *_key_args(pair.key), "-out", str(pair.cert),
        "-days", str(DAYS_CA), "-subj", f"/CN={subject}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    _private(pair.key)
    return pair


def _sign(ca: CertPair, pair: CertPair, common_name: str, extensions: Sequence[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        csr = Path(tmp) / "req.csr"
        ext = Path(tmp) / "ext.cnf"
        ext.write_text("\n".join(extensions) + "\n")
        _openssl(
            "req", "-new", *_key_args(pair.key), "-out", str(csr), "-subj", f"/CN={common_name}"
        )
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
            "-set_serial", "0x" + secrets.token_hex(16), "-days", str(DAYS_LEAF),
            "-out", str(pair.cert), "-extfile", str(ext),
        )  # fmt: skip
    _private(pair.key)


def _san(hosts: Iterable[str]) -> str:
    names = []
    for host in hosts:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            names.append(f"DNS:{host}")
        else:
            names.append(f"IP:{host}")
    return "subjectAltName=" + ",".join(names)


def make_server_cert(
    directory: Path | str,
    ca: CertPair,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    name: str = "server",
) -> CertPair:
    """The server's certificate, valid for each of `hosts` (DNS names or addresses)."""
    if not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    pair = CertPair(out / f"{name}.pem", out / f"{name}.key")
    _sign(
        ca,
        pair,
        hosts[0],
        [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            # clientAuth too: a follower instance presents it to the leader's admin
            # listener (llmgw.admin.leader).
            "extendedKeyUsage=serverAuth,clientAuth",
            _san(hosts),
        ],
    )
    return pair


def make_node_cert(
    directory: Path | str, ca: CertPair, node_id: str, name: str | None = None
) -> CertPair:
    """A node's client certificate: common name = `node_id`; ``name`` defaults to it."""
    if not node_id or "/" in node_id or "\n" in node_id:
        raise ValueError(f"not usable as a certificate's common name: {node_id!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    stem = name or node_id
    pair = CertPair(out / f"{stem}.pem", out / f"{stem}.key")
    _sign(
        ca,
        pair,
        node_id,
        [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=clientAuth",
        ],
    )
    return pair


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("directory", help="where to write the PEM files")
    parser.add_argument("nodes", nargs="*", help="node ids to make client certificates for")
    parser.add_argument(
        "--host",
        action="append",
        dest="hosts",
        help="a name or address agents dial the server by (repeatable; "
        "default: localhost and 127.0.0.1)",
    )
    args = parser.parse_args(argv)
    out = Path(args.directory)
    try:
        ca_cert = out / "ca.pem"
        if ca_cert.exists() and (out / "ca.key").exists():
            ca = CertPair(ca_cert, out / "ca.key")  # add to an existing CA
        else:
            ca = make_ca(out)
        made = [ca.cert]
        if args.hosts or not (out / "server.pem").exists():  # else keep the server's
            made.append(make_server_cert(out, ca, args.hosts or ("localhost", "127.0.0.1")).cert)
        made.extend(make_node_cert(out, ca, node).cert for node in args.nodes)
    except (CertError, ValueError, OSError) as exc:
        print(f"certs: {exc}", file=sys.stderr)
        return 1
    for path in made:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
