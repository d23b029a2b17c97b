"""What both backends share: the SQL of every operation and the Store methods around it.

Each operation is a plain synchronous function of a :class:`~llmgw.store.sql.db.DB`
(a thin adapter over one DB-API connection), run by a backend on one of its threads
inside a transaction. The SQL is written once with ``?`` placeholders; the PostgreSQL
adapter turns them into ``%s``. :class:`~llmgw.store.sql.threaded.ThreadedStore`
implements every async method of :class:`~llmgw.store.base.Store` on top of two
primitives a backend provides: ``_read(fn)`` and ``_write(fn)``.

One module per group of tables:

* :mod:`~llmgw.store.sql.db`: the DB protocol the operations run on;
* :mod:`~llmgw.store.sql.schema`: migrations (schema_version);
* :mod:`~llmgw.store.sql.keys`: API keys and the dashboard sessions opened with them;
* :mod:`~llmgw.store.sql.usage`: usage records;
* :mod:`~llmgw.store.sql.runtime`: runtime models and node cordons;
* :mod:`~llmgw.store.sql.rates`: rate limits shared by every instance;
* :mod:`~llmgw.store.sql.cluster`: leadership, published endpoints, demand;
* :mod:`~llmgw.store.sql.threaded`: the Store methods over them, on worker threads.
"""
