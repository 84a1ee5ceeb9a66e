"""The ``openai`` backend on the HTTP client named by ``BENCH_TRANSPORT`` (``http1``,
``aiohttp`` or ``httpcore``; see ``bench/transports.py``), put in place on import:

    BENCH_TRANSPORT=aiohttp python -m uvicorn with_transport:application --app-dir bench
    BENCH_TRANSPORT=aiohttp PYTHONPATH=bench pytest -p with_transport tests/backends/...

``application`` is the example project's ASGI application.
"""

from __future__ import annotations

import os

import transports

transports.use(os.environ.get("BENCH_TRANSPORT", "http1"))


def __getattr__(name: str) -> object:
    if name == "application":  # imported when asked for: pytest loads this before Django
        from project.asgi import application

        return application
    raise AttributeError(name)
