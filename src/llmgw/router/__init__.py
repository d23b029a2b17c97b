"""The router (data plane): pure decisions (scrape, scoring, affinity, breaker) and I/O."""
