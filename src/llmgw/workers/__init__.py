"""Every core: the data plane in N worker processes behind one control process.

``llmgw-server --workers N`` (``workers`` in the configuration; 0, the default, is one
per core the process may run on) runs N worker processes that share the client port
(each binds it with ``SO_REUSEPORT``, and the kernel spreads connections over them),
and one control process with everything else: the control plane and its agent port,
the store, the admin listener, and one :class:`~llmgw.router.core.Router` that scrapes
the engines for the admin views and decides when idle engines sleep.

The control process and each worker talk over a private socket pair
(:mod:`llmgw.workers.wire`). The control process sends what a worker routes by: the
catalog, every endpoint the control plane publishes, drains or removes, which
engines it put to sleep, and after each control-plane pass which models cannot be
placed (for requests waiting on a cold start). A worker sends back its usage
records (the store, the dashboard and the autoscaler's idleness read them in the
control process), a report twice a second (its demand per model, its in-flight
count per endpoint, its admission queues) and its metrics when ``/metrics`` is
scraped; the control process merges them (:mod:`llmgw.workers.merge`).

The control process scrapes each engine once and passes what it found to every
worker after each pass: a scrape costs the scraper about 1.3 ms of CPU (measured:
docs/operations.md, "Every core"), which N workers would each pay per engine.

Workers agree on a prefix's and a session's home replica without talking to each
other: an unseen key's home is a rendezvous hash of the key over the replicas that
can take it (:mod:`llmgw.router.scheduling`), so N workers keep a prefix on one
replica as one process does. A worker that dies is started again; the
others keep serving meanwhile.

:mod:`llmgw.workers.pool` is the control process's side, :mod:`llmgw.workers.worker`
a worker's.
"""
