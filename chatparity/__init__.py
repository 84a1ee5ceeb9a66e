"""chatparity: an OpenAI-compatible Chat Completions API as a reusable Django app."""

__version__ = "0.1.0"
