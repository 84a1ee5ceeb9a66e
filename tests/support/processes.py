"""A test's function run in a Python process of its own, as another worker would."""

import os
import subprocess
import sys


def in_a_process(module: str, call: str) -> subprocess.Popen:
    """``call`` (a function of ``module`` and its arguments) in a new Django process on
    the test settings; its result is printed as JSON on its stdout."""
    script = (
        f"import django, json; django.setup(); import {module} as m; print(json.dumps(m.{call}))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
