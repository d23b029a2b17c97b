"""The web dashboard (DESIGN §8): server-rendered pages over the admin API."""

from llmgw.dashboard.app import DashboardApp
from llmgw.dashboard.traffic import TrafficRing

__all__ = ["DashboardApp", "TrafficRing"]
