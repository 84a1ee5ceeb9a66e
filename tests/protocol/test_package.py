"""The wire format is a library of its own: nothing in it needs Django."""

import subprocess
import sys

IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
import chatparity.protocol as protocol
for module in pkgutil.iter_modules(protocol.__path__):
    importlib.import_module(f"chatparity.protocol.{module.name}")
print(sorted(name for name in sys.modules if name.split(".")[0] == "django"))
"""


def test_no_module_of_the_protocol_imports_django():
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]"
