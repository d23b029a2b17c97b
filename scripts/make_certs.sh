#!/usr/bin/env bash
# Certificates for the agent port's mutual TLS (docs/transport.md) and the https
# listeners (listen_tls, admin_tls: docs/dashboard.md), with openssl only.
#
#   scripts/make_certs.sh DIR [NODE_ID...]
#
# In DIR: a CA (ca.pem, ca.key), unless one is there already; the server's certificate
# (server.pem, server.key) for the names in SERVER_HOSTS (default "localhost
# 127.0.0.1"; put every name and address agents dial the server by), unless one is
# there already; and per NODE_ID a client certificate NODE_ID.pem/NODE_ID.key whose
# common name is the node id (the identity the server checks registrations against).
# Keys are EC P-256, unencrypted, mode 600. Re-run with new node ids to add nodes.
#
#   SERVER_HOSTS="ctl.example.com 10.0.0.5" scripts/make_certs.sh /etc/llmgw/pki gpu-1 gpu-2
#
# The server then uses  agent_tls = {cert = server.pem, key = server.key, client_ca = ca.pem}
# and each agent      --tls-cert NODE_ID.pem --tls-key NODE_ID.key --tls-ca ca.pem.
# The same server pair serves https:  listen_tls = {cert = server.pem, key = server.key}
# (clients trust ca.pem); admin_tls with client_ca = ca.pem takes NODE_ID.pem as an
# operator's client certificate, and server.pem as another instance's (a follower
# passes fleet calls to the leader with it: hence clientAuth too).
# (src/llmgw/transport/certs.py does the same from Python.)
set -euo pipefail

if [[ $# -lt 1 || "$1" == -* ]]; then
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
command -v openssl >/dev/null || { echo "make_certs: openssl is not installed" >&2; exit 1; }

dir=$1
shift
hosts=${SERVER_HOSTS:-"localhost 127.0.0.1"}
days_ca=3650
days_leaf=825
mkdir -p "$dir"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

newkey=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)

# sign NAME COMMON_NAME EXTENSIONS...: NAME.key and NAME.pem signed by the CA
sign() {
    local name=$1 cn=$2
    shift 2
    printf '%s\n' "$@" >"$tmp/$name.ext"
    openssl req -new "${newkey[@]}" -keyout "$dir/$name.key" -out "$tmp/$name.csr" \
        -subj "/CN=$cn" 2>/dev/null
    openssl x509 -req -in "$tmp/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days "$days_leaf" \
        -extfile "$tmp/$name.ext" -out "$dir/$name.pem" 2>/dev/null
    chmod 600 "$dir/$name.key"
    chmod 644 "$dir/$name.pem"
    echo "$dir/$name.pem"
}

if [[ ! -f "$dir/ca.pem" || ! -f "$dir/ca.key" ]]; then
    openssl req -x509 "${newkey[@]}" -keyout "$dir/ca.key" -out "$dir/ca.pem" \
        -days "$days_ca" -subj "/CN=llmgw agent CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    chmod 600 "$dir/ca.key"
    chmod 644 "$dir/ca.pem"
    echo "$dir/ca.pem"
fi

if [[ ! -f "$dir/server.pem" ]]; then
    san=""
    for host in $hosts; do
        if [[ $host =~ ^[0-9.]+$ || $host == *:* ]]; then
            san+="${san:+,}IP:$host"
        else
            san+="${san:+,}DNS:$host"
        fi
    done
    first=${hosts%% *}
    sign server "$first" \
        "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth,clientAuth" \
        "subjectAltName=$san"
fi

for node in "$@"; do
    if [[ -z $node || $node == */* ]]; then
        echo "make_certs: not a usable node id: '$node'" >&2
        exit 1
    fi
    sign "$node" "$node" \
        "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=clientAuth"
done
