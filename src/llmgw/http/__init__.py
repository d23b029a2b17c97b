"""HTTP/1.1 in both directions of the hot path, parsed by llhttp (httptools).

* :mod:`llmgw.http.server`: the listeners' server (the client API, the admin API and
  the dashboard, llmgw-sim), serving ASGI apps on trio.
* :mod:`llmgw.http.request`: the server's request parser (no I/O).
* :mod:`llmgw.http.client`: the proxy's client to engines (plain ``http://``).
* :mod:`llmgw.http.response`: the client's response parser (no I/O).
* :mod:`llmgw.http.sockio`: the non-blocking socket reads and writes both drive.
* :mod:`llmgw.http.asgi`: what llmgw's ASGI apps share (errors, bodies, dispatch).

Protocol rules (what is refused, what is bounded) live in the parsers; I/O, deadlines
and limits around them, in the server and the client. Nothing here knows about models,
engines or routing.
"""
