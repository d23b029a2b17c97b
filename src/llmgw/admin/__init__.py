"""The admin listener: metrics, health, the JSON admin API and the dashboard."""
