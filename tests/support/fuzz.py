"""What the fuzz tests of every endpoint share: the small limits they run under, the
alias they name, the generation modes and checks, and bounded runs."""

from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.scripted import SCRIPTED

# Small limits, so that generated breaches of them stay small requests.
FUZZ_SETTINGS = {
    **SCRIPTED,
    "LOG_BODIES": True,  # the request log stores whatever JSON was sent
    "MAX_BODY_BYTES": 64 * 1024,
    "MAX_MESSAGES": 8,
    "MAX_CONTENT_CHARS": 256,
}
ALIAS = "scripted"
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
# Schemathesis's checks that answers are as documented, and that what breaks the
# document is refused. Not positive_data_acceptance: a body the schema allows
# may still break a rule across fields (a tool message must answer a call just
# made), which is OpenAI's 400.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


def bounded(max_examples):
    """A fixed number of cases from a fixed seed: bounded in time, the same in every run."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


def checks_for(status: int) -> list:
    """:data:`CHECKS` for an answer of ``status``: a 413 refuses a body too large to read,
    which schemathesis's negative-data check does not count as refusing it."""
    return [check for check in CHECKS if status != 413 or check is not negative_data_rejection]
