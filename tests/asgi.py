"""An HTTP request as an ASGI server hands it to the application."""


def http_scope(
    method, path, headers=(), *, query_string="", root_path="", client=("127.0.0.1", 50000)
):
    """The scope of ``method path?query_string`` with ``headers`` (name, value) as text."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query_string.encode(),
        "root_path": root_path,
        "headers": [(name.encode(), value.encode()) for name, value in headers],
        "client": client,
        "server": ("testserver", 80),
    }
