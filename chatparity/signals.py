"""Signals for whatever else wants to know about requests (the live tail, a site's own code)."""

from django.dispatch import Signal

request_logged = Signal()
"""Sent once a request's log row is written, with ``row``: the saved
:class:`~chatparity.models.RequestLog`. Sent with ``asend_robust``: receivers
may be async, and one that raises is logged, never the request's failure."""
