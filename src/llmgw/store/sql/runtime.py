"""What operators change at run time: models and endpoints added by the admin API
(runtime_models, runtime_endpoints) and node cordons (node_cordons).
"""

from __future__ import annotations

import json

from llmgw.store.base import (
    StoredCordon,
    StoredEndpoint,
    StoredModel,
)
from llmgw.store.sql.db import DB

# -- runtime models ---------------------------------------------------------------------


def put_model(db: DB, name: str, config_json: str, now: float) -> None:
    db.run(
        "INSERT INTO runtime_models (name, config, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
        " updated_at = excluded.updated_at",
        (name, config_json, now),
    )


def delete_model(db: DB, name: str) -> bool:
    return db.run("DELETE FROM runtime_models WHERE name = ?", (name,)) > 0


def list_models(db: DB) -> list[StoredModel]:
    return [
        StoredModel(json.loads(r[0]), float(r[1]))
        for r in db.rows("SELECT config, updated_at FROM runtime_models ORDER BY name")
    ]


# -- runtime endpoints ------------------------------------------------------------------


def put_endpoint(db: DB, endpoint_id: str, config_json: str, now: float) -> None:
    db.run(
        "INSERT INTO runtime_endpoints (id, config, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET config = excluded.config,"
        " updated_at = excluded.updated_at",
        (endpoint_id, config_json, now),
    )


def delete_endpoint(db: DB, endpoint_id: str) -> bool:
    return db.run("DELETE FROM runtime_endpoints WHERE id = ?", (endpoint_id,)) > 0


def list_endpoints(db: DB) -> list[StoredEndpoint]:
    return [
        StoredEndpoint(json.loads(r[0]), float(r[1]))
        for r in db.rows("SELECT config, updated_at FROM runtime_endpoints ORDER BY id")
    ]


# -- node cordons -----------------------------------------------------------------------


def put_cordon(db: DB, node_id: str, drain: bool, now: float) -> None:
    db.run(
        "INSERT INTO node_cordons (node_id, drain, updated_at) VALUES (?, ?, ?)"
        " ON CONFLICT (node_id) DO UPDATE SET drain = excluded.drain,"
        " updated_at = excluded.updated_at",
        (node_id, drain, now),
    )


def delete_cordon(db: DB, node_id: str) -> bool:
    return db.run("DELETE FROM node_cordons WHERE node_id = ?", (node_id,)) > 0


def list_cordons(db: DB) -> list[StoredCordon]:
    return [
        StoredCordon(str(r[0]), bool(r[1]), float(r[2]))
        for r in db.rows("SELECT node_id, drain, updated_at FROM node_cordons ORDER BY node_id")
    ]
