"""A client request's way through the router, one way: the client app
(llmgw.router.app) reads it and authenticates its key (:mod:`.authenticate`), makes one
:class:`~.request.Request`, and hands it to the :class:`~.flow.Pipeline`: admission by
priority band (:mod:`.admit`), a replica picked (:mod:`.schedule`), attempts at
replicas (:mod:`.attempt`), and its end written down in one place (:mod:`.account`).
"""

from llmgw.router.pipeline.flow import Pipeline
from llmgw.router.pipeline.request import Native, Progress, Request

__all__ = ["Native", "Pipeline", "Progress", "Request"]
