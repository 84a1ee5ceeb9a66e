def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", help="Rewrite golden transcripts from the code."
    )
