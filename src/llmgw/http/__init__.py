"""HTTP/1.1 in both directions of the hot path, parsed by llhttp (httptools).

* :mod:`llmgw.http.server`: the listeners' server (the client API, the admin API and
  the dashboard, llmgw-sim), serving ASGI apps on trio.
* :mod:`llmgw.http.request`: the server's request parser (no I/O).
* :mod:`llmgw.http.engine_client`: the one client to engines (the proxy's requests,
  scrapes, sleep and wake, tokenize, stored responses): :mod:`llmgw.http.client` for
  plain ``http://``, httpx (:mod:`llmgw.http.engine_httpx`) for the rest.
* :mod:`llmgw.http.client`: llmgw's own HTTP/1.1 client (plain ``http://``).
* :mod:`llmgw.http.response`: the client's response parser (no I/O).
* :mod:`llmgw.http.sockio`: the non-blocking socket reads and writes both drive.
* :mod:`llmgw.http.asgi`: what llmgw's ASGI apps share (errors, bodies, dispatch).

Protocol rules (what is refused, what is bounded) live in the parsers; I/O, deadlines
and limits around them, in the server and the client. Nothing here knows about models
or routing (to the engine client, an engine is a server it sends requests to).
"""
