"""The conformance checker: does a server speak OpenAI's Chat Completions and Responses
wire formats, and Anthropic's Messages API?

Opt-in (``pip install 'django-chatparity[conformance]'``, which brings httpx): add
``"chatparity.conformance"`` to ``INSTALLED_APPS`` for ``manage.py chatparity_conformance``.
The checks are one module per API (:mod:`.chat`, :mod:`.responses`, :mod:`.messages`) built on
:mod:`.framework`; :mod:`.suite` lists them and runs them.
"""
